"""What `pip install .` puts in site-packages: one `tritium` package, the role folders inside it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile

from tests.servers import PROJECT_ROOT

ROLE_FOLDERS = {"gateway": "tritium.gateway", "broker": "tritium.broker", "workers": "tritium.workers",
                "repo": "tritium.repo", "tritium": "tritium"}


def _setuptools() -> dict:
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_source_folder_is_a_listed_package():
    found = set()
    for folder, package in ROLE_FOLDERS.items():
        for init in (PROJECT_ROOT / folder).rglob("*.py"):
            relative = init.parent.relative_to(PROJECT_ROOT / folder)
            if "__pycache__" not in relative.parts:
                found.add(".".join([package, *relative.parts]))
    assert found == set(_setuptools()["packages"])


def test_the_wheel_holds_only_the_tritium_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path),
                    str(PROJECT_ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("tritium-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"tritium", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    for folder in ("gateway", "broker", "workers", "repo"):
        assert f"tritium/{folder}/" in {name[:len(f"tritium/{folder}/")] for name in names}
    assert "tritium/workers/instance.py" in names and "tritium/backend.py" in names
