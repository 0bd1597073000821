#!/bin/sh
# The GPU acceptance on a GPU machine without network that has Python and torch: the wheels
# that 'nox -s gpu_wheels' downloaded into .gpu-wheels/ (copied beside the tree) supply what
# that Python lacks, nox among them; then 'nox -s gpu'. Arguments go to the acceptance, e.g.
#   sh tools/gpu-acceptance.sh --dry-run
set -e
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" tools/install_missing_wheels.py .gpu-wheels .gpu-wheels/site
PYTHONPATH="$PWD/.gpu-wheels/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
exec "$PY" -m nox -s gpu -- "$@"
