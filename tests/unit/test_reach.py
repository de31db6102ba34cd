"""Whether other users can reach a path, from the modes of the directories above it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from gpuwatch.state.reach import blocked_at


def test_a_private_directory_above_blocks_and_an_open_one_does_not() -> None:
    # Under /tmp, not pytest's own directory, which is root's alone.
    top = Path(tempfile.mkdtemp(prefix="gpuwatch-reach-"))
    try:
        top.chmod(0o755)
        private = top / "private"
        private.mkdir(mode=0o700)
        private.chmod(0o700)
        assert blocked_at(top / "push.sock") is None
        assert blocked_at(private / "push.sock") == (private, 0o700)
        # Searchable by its group only: blocked for others, open to that group's members.
        private.chmod(0o710)
        gid = private.stat().st_gid
        assert blocked_at(private / "push.sock") == (private, 0o710)
        assert blocked_at(private / "push.sock", gid) is None
        assert blocked_at(private / "push.sock", gid + 1) == (private, 0o710)
    finally:
        shutil.rmtree(top)


def test_a_link_is_followed_to_where_it_points(tmp_path: Path) -> None:
    """systemd's StateDirectory with DynamicUser: /var/lib/gpuwatch links into the private
    /var/lib/private."""
    private = tmp_path / "private"
    (private / "gpuwatch").mkdir(parents=True)
    private.chmod(0o700)
    os.symlink(private / "gpuwatch", tmp_path / "gpuwatch")
    blocked = blocked_at(tmp_path / "gpuwatch" / "textfiles" / "x.prom")
    assert blocked is not None and blocked[1] & 0o001 == 0
