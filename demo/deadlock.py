"""A data-loading job that freezes the way real ones do (CPython gh-74580 and its family): a background
thread holds a lock while the main thread forks a worker through multiprocessing's "fork" context; the
worker inherits the lock held, waits for it forever, and the parent waits for the worker forever.
Nothing is printed, nothing crashes: only a watchdog notices."""

import multiprocessing
import threading
import time

cache_lock = threading.Lock()
filled = threading.Event()


def refresh_cache() -> None:
    while True:
        with cache_lock:
            filled.set()
            time.sleep(3600)  # a long refresh, lock held


def load_shard(n: int) -> None:
    with cache_lock:  # copied held by fork(): nobody in this process will release it
        print("shard", n, "loaded", flush=True)


threading.Thread(target=refresh_cache, name="cache-refresher", daemon=True).start()
filled.wait()
print("starting shard loaders", flush=True)
worker = multiprocessing.get_context("fork").Process(target=load_shard, args=(0,))
worker.start()
worker.join()
