"""Answers already computed, keyed by esun_uuid, so that a retry is answered at once.

A package of its own, at the top beside `api/` and `model/`, because it is infrastructure that neither layer
owns: the views read and write it through the `ResultCache` protocol, the batcher's done-callbacks store into
it, and nothing in it knows HTTP or tensors. It is called a cache, not a store, because it may forget: a miss
is always answerable (TOP1), so an answer lives only for `cache_ttl_s`, in at most `cache_size` entries.

`ResultCache` is the interface the views use (get/put). Four implementations:

- `MemoryResultCache` (`cache.memory`): the in-process LRU with a time-to-live (the default, and the first
  level of the layered cache);
- `RedisResultCache` (`cache.redis_cache`): answers shared by every replica behind the load balancer, so a
  retry that lands on another replica than its first attempt still gets the corrected answer;
- `SqliteResultCache` (`cache.sqlite_cache`): answers shared by the worker processes of one server through a SQLite
  file in `shared_dir`, when there are several and no Redis (the embedded default: no server to run);
- `LayeredResultCache` (`cache.layered`): the one the app serves with: the local cache first, then Redis when
  `redis_url` is set (else SQLite when the workers share a folder), and it counts hits and misses per level. It
  writes to the shared level through a `WriteBehind` (`cache.write_behind`): one daemon thread.

Redis is a help, never a dependency: every Redis call has short socket timeouts and no retries, and a
`CircuitBreaker` (`cache.breaker`) stops calling a Redis that keeps failing, so a dead or slow Redis costs at
most a few `timeout_s` every `cooldown_s` and the service answers from the local cache (or TOP1) within its
budget. A Redis that is slow but answers (30 ms a SET) never trips the breaker, so writes do not wait for it at
all: they are queued for the writer thread, and dropped (counted) when the queue is full. Reads stay
synchronous. Values are JSON text (`{"answer": "..."}`), read back with `json.loads` and checked: never pickle,
so a value planted in Redis by someone else can at worst be ignored, never run.

Every module logs to `api.cache`, the name the service's JSON log stream (api.logs) already carries and
operators already search for.
"""

from cache.breaker import CircuitBreaker
from cache.layered import LayeredResultCache, build_cache
from cache.memory import MemoryResultCache
from cache.protocols import CacheObserver, ResultCache, SharedStore
from cache.redis_cache import RedisResultCache
from cache.sqlite_cache import SqliteResultCache
from cache.write_behind import WriteBehind

__all__ = [
    "CacheObserver", "CircuitBreaker", "LayeredResultCache", "MemoryResultCache", "RedisResultCache",
    "ResultCache", "SharedStore", "SqliteResultCache", "WriteBehind", "build_cache",
]
