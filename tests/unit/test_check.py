"""`jobns check` (no root): a user's directives through the prolog's own parser and
plans, one line saying what the job would get, or setup's refusal and exit 125."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobns.launcher.commands.check import sbatch_comment
from jobns.launcher.commands.cli import dispatch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "jobns.toml"
    path.write_text(
        f'state_dir = "{tmp_path}/no-such-state"\nshared_base = "{tmp_path}"\n'
        '[capacity]\nshm_max = "4GiB"\n'
        f'[staging]\nstage_roots = ["{tmp_path}"]\n'
    )
    return path


def check(config: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = dispatch(["check", "--config", str(config), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_comment_the_job_gets(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = check(
        config, "--comment", "jobns: shm capacity=2GiB; tmp capacity=1G", capsys=capsys
    )
    assert (code, err) == (0, "")
    assert out == (
        "jobns check: ok (--comment): local layout (/tmp and /var/tmp on this node); "
        "/dev/shm 2.0 GiB; /tmp and /var/tmp 1.0 GiB\n"
    )


def test_a_misspelt_comment_is_refused_naming_the_comment(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = check(config, "--comment", " jobns: shm capcity=2GiB", capsys=capsys)
    assert (code, out) == (125, "")
    assert err == (
        "jobns: check: jobns setup would refuse the job: --comment item 1: "
        "'shm capcity=2GiB': unknown key 'capcity' for shm; write '#JOBNS shm "
        "capacity=SIZE'\n"
    )


def test_over_the_sites_cap_is_refused(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check(config, "--directives", "shm capacity=8GiB", capsys=capsys)
    assert code == 125 and "more than this site allows (shm_max" in err, err


def test_a_script_and_its_sbatch_comment(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n"
        '#SBATCH --comment="jobns: shm capacity=1GiB"\n'
        "#JOBNS shared_tmpdir=per-node\n"
        f"#JOBNS stage_out source=/tmp/out destination={tmp_path}/%j.out\n"
        "srun jobns run -- ./app\n"
    )
    code, out, err = check(config, "--script", str(script), capsys=capsys)
    assert (code, err) == (0, "")
    assert out.startswith("jobns check: ok (script job.sh, its #SBATCH --comment): per-node")
    assert "/dev/shm 1.0 GiB" in out and "stage in 0, stage out 1" in out
    # a --comment on the command line wins over the script's, as with sbatch
    code, out, _ = check(
        config, "--script", str(script), "--comment", "jobns: shm capacity=3GiB", capsys=capsys
    )
    assert code == 0 and "/dev/shm 3.0 GiB" in out and "(script job.sh, --comment)" in out
    # a script line that does not parse names its line
    script.write_text("#!/bin/bash\n#JOBNS tmp capacity=2 GiB\n")
    code, _, err = check(config, "--script", str(script), capsys=capsys)
    assert code == 125 and "script line 2: '#JOBNS tmp capacity=2 GiB'" in err, err


def test_a_stage_path_outside_the_roots_is_refused(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = check(
        config, "--directives", "stage_in source=/etc/passwd destination=/tmp/p", capsys=capsys
    )
    assert code == 125 and "would refuse the job" in err and "/etc/passwd" in err, err


def test_nothing_to_check_is_an_error(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check(config, capsys=capsys)
    assert code == 125 and "nothing to check" in err


def test_sbatch_comment() -> None:
    assert sbatch_comment("#!/bin/sh\n#SBATCH --comment 'a b'\n") == "a b"
    assert sbatch_comment("#SBATCH -N1 --comment=x\n#SBATCH --comment=y\n") == "y"
    assert sbatch_comment("#!/bin/sh\necho\n#SBATCH --comment=late\n") is None  # after the header
    assert sbatch_comment("# SBATCH --comment=off\n") is None


def test_check_imports_no_more_than_it_needs(config: Path) -> None:
    """No pyroute2 (the network), no disk-image, or staging-step code: a check
    plans, never makes. (The prolog's gather_directives lives in launcher.lifecycle,
    whose module it imports: ~12 ms, the price of the very same parser and messages.)"""
    code = (
        "import sys\nfrom jobns.launcher.commands.cli import dispatch\n"
        f"assert dispatch(['check', '--config', {str(config)!r}, '--comment', "
        "'jobns: shm capacity=1GiB']) == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pyroute2', "
        "'jobns.launcher.backing.diskimage', 'jobns.launcher.backing.kinds', "
        "'jobns.launcher.staging.steps'))))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert r.stdout.splitlines()[-1] == "[]", r.stdout
