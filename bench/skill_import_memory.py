"""Peak memory of importing a 50 MiB skill, above the importing process's idle size.

Each measurement runs in a fresh child process: Django set up and the skills code imported,
then the peak RSS reset (/proc/self/clear_refs) and the RSS read as "idle"; it imports one
skill and reports its peak RSS (VmHWM) minus idle. The figures:
- folder: `import_folder` of a 50 MiB folder (what `manage.py import_skill FOLDER` runs);
- zip: `import_archive` of the same skill as a stored zip (the upload and `import_skill X.zip`);
- baseline: the same child only reading the folder's files into memory, as a whole-skill
  reader must; the ratio below compares the import to it.
The skill is 100 files of 512 KiB of random bytes plus SKILL.md (incompressible, so the zip is
also about 50 MiB). PostgreSQL's own memory is not the importer's and is not counted.

Usage: python bench/skill_import_memory.py   (REDIS_URL and DATABASE_URL default to the local
Redis and PostgreSQL; a test database is created and dropped)
The last line is one JSON object: folder_mb and zip_mb (peak above idle, goal < 150),
baseline_mb, ratio (worst import / baseline) and skill_mb.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings.test")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")

FILES = 100
FILE_BYTES = 512 * 1024
MIB = 1024 * 1024
SKILL = "memory-bench-skill"


def status_mb(key: str) -> float:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise SystemExit(f"no {key} in /proc/self/status")


def reset_peak() -> None:
    """Start the peak (VmHWM) afresh, so Django's own set-up peak is not counted (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def child(mode: str, path: str) -> None:
    import django

    django.setup()
    from console.services import SYSTEM
    from skills.archives import Limits
    from skills.models import Skill
    from skills.services import import_archive, import_folder

    reset_peak()
    idle = status_mb("VmRSS")
    if mode == "folder":
        result = import_folder(path, actor=SYSTEM)
        assert result.created, "the bench database should start empty"
    elif mode == "zip":
        limits = Limits(archive_bytes=200 * MIB, uncompressed_bytes=200 * MIB)
        with open(path, "rb") as archive:
            result = import_archive(archive, Path(path).name, actor=SYSTEM, limits=limits)
        assert result.created
    else:
        held = [p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()]
        assert sum(len(data) for data in held) > FILES * FILE_BYTES
    peak = status_mb("VmHWM")
    Skill.objects.all().delete()
    print(json.dumps({"idle_mb": round(idle, 1), "above_idle_mb": round(peak - idle, 1)}))


def write_skill(root: Path) -> tuple[Path, Path]:
    folder = root / SKILL
    (folder / "assets").mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {SKILL}\ndescription: Big assets. Use when measuring import memory.\nlicense: MIT\n---\n\nHi.\n"
    )
    rng = random.Random(7)
    for i in range(FILES):
        (folder / "assets" / f"blob{i:03d}.bin").write_bytes(rng.randbytes(FILE_BYTES))
    archive = root / f"{SKILL}.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as out:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                out.write(path, f"{SKILL}/{path.relative_to(folder).as_posix()}")
    return folder, archive


def measure(mode: str, path: Path, env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(path)], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{mode} child failed:\n{done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    root = Path(tempfile.mkdtemp(prefix="skill-memory-bench-"))
    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        folder, archive = write_skill(root)
        url = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/" + connection.settings_dict["NAME"]
        env = {**os.environ, "DATABASE_URL": url}
        baseline = measure("baseline", folder, env)
        by_folder = measure("folder", folder, env)
        by_zip = measure("zip", archive, env)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        teardown_test_environment()
        shutil.rmtree(root, ignore_errors=True)
    worst = max(by_folder["above_idle_mb"], by_zip["above_idle_mb"])
    print(f"idle: {by_folder['idle_mb']} MB; baseline (files held in memory): {baseline['above_idle_mb']} MB")
    print(
        json.dumps(
            {
                "skill_mb": round(FILES * FILE_BYTES / MIB, 1),
                "folder_mb": by_folder["above_idle_mb"],
                "zip_mb": by_zip["above_idle_mb"],
                "baseline_mb": baseline["above_idle_mb"],
                "ratio": round(worst / max(baseline["above_idle_mb"], 0.1), 2),
                "goal_mb": 150,
            }
        )
    )


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
