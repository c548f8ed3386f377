"""A scrape in the multiprocess mode survives the files of processes that are just starting.

prometheus-client creates a process's value file and sizes it only afterwards: a scrape at that
moment found a 0-byte file and answered 500 (seen behind nginx with two Daphne replicas while
20 sessions were driven: bench/ops_load.py). A process SIGKILLed in that moment leaves the empty
file for good. Each case runs in a process of its own: the multiprocess mode is chosen when
`console.metrics` is first imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRAPE = """
import json, os, sys
from pathlib import Path
from console import metrics
metrics.HTTP_REQUESTS.labels(area="api", method="GET", status="200").inc(7)
folder = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
# A process that has just created its files (or was killed before it sized them).
for name in sys.argv[1:]:
    (folder / name).touch()
from prometheus_client.parser import text_string_to_metric_families
text = metrics.render().decode()
found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
         if s.labels.get("area") == "api" or not s.labels}
print("RESULT " + json.dumps({"api": found.get("console_http_requests_total"),
                              "empty_left": sorted(p.name for p in folder.glob("*.db") if p.stat().st_size == 0)}))
"""


def run_scrape(folder: Path, *empty_files: str) -> dict[str, object]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder), "DJANGO_SETTINGS_MODULE": "console.settings.test"}
    done = subprocess.run(
        [sys.executable, "-c", SCRAPE, *empty_files], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0]))


def test_an_empty_file_of_a_starting_or_killed_process_does_not_fail_the_scrape(tmp_path: Path) -> None:
    # pid 4194304 is above Linux's pid_max: a process that is gone, as after a SIGKILL.
    result = run_scrape(tmp_path, "counter_4194304.db", "histogram_4194304.db", "gauge_livesum_4194304.db")
    assert result["api"] == 7.0
    # Its counts are not deleted (a starting process is about to size and fill them); its live
    # gauge goes, as any dead process's does.
    assert result["empty_left"] == ["counter_4194304.db", "histogram_4194304.db"]


def test_the_scrape_still_adds_up_the_files_that_have_values(tmp_path: Path) -> None:
    assert run_scrape(tmp_path)["api"] == 7.0
