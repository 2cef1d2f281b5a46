"""`make sanitize`: the NumPy, capsule, producer and buffer tests, the
PyTorch tensor tests (test_torch_tensors.py: tensors swapped or resized by
later arguments, conversions, inference tensors) and the borrow registry's
(test_registry.py), under valgrind's memcheck, with PYTHONMALLOC=malloc so
that every Python allocation is seen.
Counts the errors (invalid reads and writes, uses of uninitialised values,
bad frees, definitely lost memory) whose stacks include dlcast code: the
test extension (which links dlcast_runtime) or a dlcast_runtime symbol.
Errors elsewhere (CPython, NumPy) are counted separately, for information.
Exits 1 if dlcast code has any. JAX is left out (too slow under valgrind);
importing PyTorch there takes about 5 minutes."""

import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out" / "sanitize"
FILES = os.environ.get(
    "DLCAST_SANITIZE_FILES",
    "tests/python/test_capsules.py tests/python/test_producers.py tests/python/test_exchange_api.py "
    "tests/python/test_aliasing.py tests/python/test_torch_tensors.py tests/python/test_registry.py",
).split()
EXAMPLES = os.environ.get("DLCAST_SANITIZE_EXAMPLES", "300")
DLCAST_MARKERS = ("dlcast_testext", "dlcast_runtime")


def is_dlcast(frame):
    text = " ".join((frame.findtext(tag) or "") for tag in ("obj", "fn", "file", "dir"))
    return any(m in text for m in DLCAST_MARKERS)


def describe(error):
    what = error.findtext("what") or error.findtext("xwhat/text") or error.findtext("kind")
    frames = list(error.iter("frame"))
    top = [f"    {f.findtext('fn') or '?'} ({Path(f.findtext('obj') or '?').name})" for f in frames[:12]]
    return "\n".join([f"  {error.findtext('kind')}: {what}"] + top)


def main():
    if shutil.which("valgrind") is None:
        print("sanitize: valgrind not found (apt-get install valgrind)", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("memcheck.*.xml"):
        old.unlink()
    env = dict(os.environ, PYTHONMALLOC="malloc", DLCAST_NO_JAX="1",
               DLCAST_HYPOTHESIS_EXAMPLES=EXAMPLES, PYTHONDONTWRITEBYTECODE="1")
    cmd = ["valgrind", "--tool=memcheck", "--xml=yes",
           f"--xml-file={OUT}/memcheck.%p.xml", "--num-callers=50",
           "--leak-check=full", "--show-leak-kinds=definite",
           "--errors-for-leak-kinds=definite", "--track-origins=no",
           sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILES]
    print("sanitize:", " ".join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    elapsed = time.time() - t0
    ours, theirs, leaks_ours = [], 0, 0
    for path in sorted(OUT.glob("memcheck.*.xml")):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            # A child process the tests start (a subprocess check) writes
            # only valgrind's header before it execs Python unobserved.
            continue
        for error in root.iter("error"):
            # Every stack of the error: where it happened and, for memory
            # freed or allocated, where that was (a use-after-free of an
            # object dlcast released shows dlcast in the "freed" stack).
            if any(is_dlcast(f) for f in error.iter("frame")):
                ours.append(error)
                leaks_ours += (error.findtext("kind") or "").startswith("Leak_")
            else:
                theirs += 1
    for error in ours:
        print(describe(error))
    print(f"sanitize: {len(ours)} memcheck errors in dlcast code "
          f"({leaks_ours} of them leaks); {theirs} elsewhere (CPython/NumPy); "
          f"pytest exit status {proc.returncode}; {elapsed:.0f} s under valgrind; "
          f"reports in {OUT.relative_to(ROOT)}/")
    return 1 if ours or proc.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
