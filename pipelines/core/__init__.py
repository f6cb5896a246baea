"""What every command shares: the exit codes and the usage error (`errors`); more of the commands' common ground
(configuration, outputs, sources, the Spark session) moves here as the commands become packages (issue 17)."""
