#!/bin/bash
# A (8adad1e: heap trim, the policy as before) against B (the working tree: the hold capped for a steady stream), ABAB
set -u
for i in 1 2; do
  (cd /tmp/wtA && /work/main/.venv/bin/python -m testing.soak --minutes 5 --share 0.5 --capacity 755.65 --server-setting CACHE_SIZE=20000 --out /tmp/h40/ab/A$i > /tmp/h40/ab/A$i.log 2>&1)
  (cd /work/main && .venv/bin/python -m testing.soak --minutes 5 --share 0.5 --capacity 755.65 --server-setting CACHE_SIZE=20000 --out /tmp/h40/ab/B$i > /tmp/h40/ab/B$i.log 2>&1)
done
echo done > /tmp/h40/ab/done
