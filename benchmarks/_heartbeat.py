"""A line every few seconds while a long phase of a benchmark runs.

Progress bars move only when a unit of work ends (a trial, a batch of trials, an epoch), and
at CoG's size on a GPU one engine pass can take longer than half a minute; so every phase of
a benchmark that may run that long is wrapped in :func:`heartbeat`, which prints its name and
elapsed time every ``every`` seconds (on stderr, through tqdm so that bars stay intact).
"""

import contextlib
import sys
import threading
import time


@contextlib.contextmanager
def heartbeat(what, every=20.0):
    """Print ``what: running for N s`` every ``every`` seconds until the block ends."""
    from tqdm.auto import tqdm

    done = threading.Event()
    start = time.perf_counter()

    def beat():
        while not done.wait(every):
            tqdm.write(f"{what}: running for {time.perf_counter() - start:.0f} s", file=sys.stderr)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
