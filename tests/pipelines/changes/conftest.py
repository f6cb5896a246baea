"""The small simulation every `tidegauge changes` test reads: three regions, two partitions, one leader failover."""

from __future__ import annotations

import pytest
from small_sim import small_sim


@pytest.fixture(scope="package")  # one simulation for every module here: it takes seconds to make
def sim(tmp_path_factory):
    s = small_sim(tmp_path_factory.mktemp("sim"), faults={"failover": 1})
    (fault,) = [f for f in s.result.truth["faults"] if f["kind"] == "failover"]
    s.failover_region = fault["region"]
    s.archive = s.archives[fault["region"]]  # the VT that holds the re-produced duplicates
    return s
