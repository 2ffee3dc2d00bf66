"""Waiting on a descriptor numbered 1024 or above works (select() refuses
those; a busy worker or a long-lived process can hold that many)."""

from __future__ import annotations

import os
import resource

from spoolctl.runner.wakeup import readable, wait_readable


def test_a_descriptor_above_1023_can_be_waited_on() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    read_fd, write_fd = os.pipe()
    high_read, high_write = os.dup2(read_fd, 1100), os.dup2(write_fd, 1101)
    try:
        assert readable([high_read], 0) == []
        os.write(high_write, b"x")
        assert readable([high_read], 1) == [high_read]
        wait_readable([high_read], 1, high_read)  # drains it
        assert readable([high_read], 0) == []
    finally:
        for fd in (read_fd, write_fd, high_read, high_write):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
