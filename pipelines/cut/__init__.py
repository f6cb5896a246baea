"""`tidegauge cut`: a consistent cut of a store version at one upstream time, and a region's snapshot at it."""
