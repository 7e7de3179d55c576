"""Where a command's output file goes (``gpucost.output_files``): whole, by a rename in the folder of the file it
replaces; through a link to the file it leads to, the link kept; into a device or pipe as it is; and refused, with
what to give, for a descriptor's path, a loop of links and a link another user planted in a sticky folder."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from gpucost.output_files import destination, write_whole
from gpucost.wiring import UsageError


def test_a_plain_path_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path: Path) -> None:
    out = tmp_path / "a.txt"
    out.write_text("old")
    write_whole(out, "new", "--out")
    assert out.read_text() == "new" and os.listdir(tmp_path) == ["a.txt"]


def test_a_chain_of_links_replaces_the_file_at_its_end_and_keeps_the_links(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    real, first, second = tmp_path / "d" / "real.txt", tmp_path / "first", tmp_path / "d" / "second"
    real.write_text("old")
    second.symlink_to("real.txt")  # relative, to its own folder
    first.symlink_to(second)
    write_whole(first, "new", "--out")
    assert real.read_text() == "new" and first.is_symlink() and second.is_symlink()


def test_a_dangling_link_makes_its_target_whole_or_not_at_all(tmp_path: Path) -> None:
    link, target = tmp_path / "link", tmp_path / "target"
    link.symlink_to(target)

    def half(path: Path) -> None:
        path.write_text("half")
        raise UsageError("the input stopped half-way")

    with pytest.raises(UsageError):
        write_whole(link, half, "--out")
    assert not target.exists() and sorted(os.listdir(tmp_path)) == ["link"]
    write_whole(link, "whole", "--out")
    assert target.read_text() == "whole" and link.is_symlink()


def test_a_named_pipe_is_written_into_and_stays_a_pipe(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    write_whole(fifo, "through", "--out")
    reader.join(timeout=30)
    assert got == ["through"] and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_device_is_written_into(tmp_path: Path) -> None:
    assert destination(Path("/dev/null"), "--out") is None
    write_whole(Path("/dev/null"), "nothing", "--out")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


@pytest.mark.parametrize("path", ["/dev/stdout", "/dev/stderr", "/dev/fd/1", "/proc/self/fd/1"])
def test_a_descriptor_s_path_is_refused(path: str, tmp_path: Path) -> None:
    """Reopened, it starts at the file's beginning; renamed over, the shell's file goes: either loses what the shell
    wrote around the command. A link to one is refused too."""
    with pytest.raises(UsageError, match="descriptor of this process"):
        write_whole(Path(path), "x", "--out")
    link = tmp_path / "out"
    link.symlink_to(path)
    with pytest.raises(UsageError, match="descriptor of this process"):
        write_whole(link, "x", "--out")


def test_a_loop_of_links_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(UsageError, match="a chain of more than 40 links"):
        write_whole(tmp_path / "a", "x", "--out")


@pytest.mark.skipif(os.geteuid() != 0, reason="making a link of another user needs root")
def test_a_link_another_user_planted_in_a_sticky_folder_is_refused(tmp_path: Path) -> None:
    shared, victim = tmp_path / "tmp", tmp_path / "victim"
    shared.mkdir()
    shared.chmod(0o1777)
    victim.write_text("kept")
    planted = shared / "report.html"
    planted.symlink_to(victim)
    os.lchown(planted, 65534, 65534)  # nobody's
    with pytest.raises(UsageError, match="a link of another user"):
        write_whole(planted, "pwned", "--html")
    assert victim.read_text() == "kept"
    os.lchown(planted, os.geteuid(), os.getegid())  # one's own link there is followed
    write_whole(planted, "mine", "--html")
    assert victim.read_text() == "mine"
