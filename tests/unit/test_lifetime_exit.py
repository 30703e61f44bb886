"""`exit_now` ends a rank with its code and loses nothing buffered (planner.executor.lifetime says why ranks end so)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import atexit, logging, sys
    from planner.executor.lifetime import exit_now
    logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
    logging.info("logged before exit")
    atexit.register(lambda: print("finalization ran"))
    sys.stdout.write("buffered, no newline")
    sys.stderr.write("err buffered")
    exit_now(int(sys.argv[2]))
""")


def test_exit_now_keeps_the_code_and_flushes_streams_and_logs(tmp_path):
    log = tmp_path / "rank.log"
    for code in (0, 3):
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(log), str(code)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == code, out.stderr
        assert out.stdout == "buffered, no newline"  # flushed, and no finalization (the atexit hook never ran)
        assert out.stderr == "err buffered"
        assert "logged before exit" in log.read_text()
