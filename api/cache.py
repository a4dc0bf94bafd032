"""Moved: the answer cache is the top-level `cache` package (memory, Redis, write-behind, layered).

Only the import in api/predict.py still reads from here (that module is being reworked beside this move);
delete this file once it imports `cache.ResultCache` directly.
"""

from cache import (
    CacheObserver,
    CircuitBreaker,
    LayeredResultCache,
    MemoryResultCache,
    RedisResultCache,
    ResultCache,
    WriteBehind,
    build_cache,
)

__all__ = [
    "CacheObserver", "CircuitBreaker", "LayeredResultCache", "MemoryResultCache", "RedisResultCache",
    "ResultCache", "WriteBehind", "build_cache",
]
