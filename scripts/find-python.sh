#!/usr/bin/env bash
# Prints the path of a Python >= 3.12 interpreter, or fails with a message.
# Order: $PYTHON, python3.13/python3.12/python3 on PATH, pyenv versions, /usr/bin.
set -u
ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }
cands=()
[ -n "${PYTHON:-}" ] && cands+=("$PYTHON")
for n in python3.13 python3.12 python3; do
  p=$(command -v "$n" 2>/dev/null) && cands+=("$p")
done
root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
for d in $(ls -d "$root"/versions/3.1[2-9]* 2>/dev/null | sort -rV); do
  for b in "$d"/bin/python3.1[2-9] "$d"/bin/python3; do [ -x "$b" ] && cands+=("$b"); done
done
cands+=(/usr/bin/python3.13 /usr/bin/python3.12 /usr/local/bin/python3.13 /usr/local/bin/python3.12)
for c in "${cands[@]}"; do
  if [ -x "$c" ] && ok "$c"; then echo "$c"; exit 0; fi
done
echo "find-python: no Python >= 3.12 found (set PYTHON=/path/to/python3.12)" >&2
exit 1
