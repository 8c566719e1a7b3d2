#!/usr/bin/env bash
# Prints the directory holding libnvrtc.so* (from the PyPI wheel or a CUDA install), or nothing.
for d in $(python3 - 2>/dev/null <<'PY'
import importlib.util, os, glob
for name in ("nvidia",):
    spec = importlib.util.find_spec(name)
    if spec and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            for f in glob.glob(os.path.join(root, "**", "libnvrtc.so*"), recursive=True):
                print(os.path.dirname(f))
PY
) /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
  if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then echo "$d"; exit 0; fi
done
