# sourced by every device call: wheels onto PYTHONPATH, the peers' "venvs" as wrappers around python3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for v in trl tunix; do mkdir -p /tmp/peers/$v/bin; printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/peers/$v/bin/python; chmod +x /tmp/peers/$v/bin/python; done
