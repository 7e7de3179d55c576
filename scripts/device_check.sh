#!/usr/bin/env bash
# The checks that need a real GPU, for a machine lent with one (docs/testing.md, "On a real GPU"). That machine
# reaches no registry: the project and the dependencies it lacks travel as wheels in .whl (built by
# `scripts/device_wheels.sh` here). Each section runs on even if one before it failed, and prints what it saw;
# the log goes to $OUT/device_check.log. Usage: bash scripts/device_check.sh [SECTION…] (default: all).
set -uo pipefail
OUT=${OUT:-/tmp/device-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=dev
PY=python3
SECTIONS=${*:-"smi install kernel gpm tests cupti"}
section() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

for s in $SECTIONS; do case $s in
smi)
  section "the GPU and its driver"
  nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,mig.mode.current,clocks.max.sm --format=csv
  uname -r; $PY --version ;;
install)
  section "install the project from .whl"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && echo "installed: $(ls .whl | tr '\n' ' ')"
  export PYTHONPATH=/tmp/site
  $PY -c "import gpucost.streams, duckdb, pydantic, aiokafka; print('gpucost imports; duckdb', duckdb.__version__)" ;;
kernel)
  section "can this kernel run the eBPF probes (bpf(2), tracefs, uprobes)?"
  $PY - <<'PY'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
attr = (ctypes.c_uint32 * 32)(2, 4, 4, 1)  # BPF_MAP_TYPE_ARRAY, key 4 B, value 4 B, 1 entry
fd = libc.syscall(321, 0, ctypes.byref(attr), ctypes.sizeof(attr))  # bpf(BPF_MAP_CREATE, …)
print("bpf(BPF_MAP_CREATE):", "allowed" if fd >= 0 else f"refused: {os.strerror(ctypes.get_errno())}")
for path in ("/proc/sys/kernel/perf_event_paranoid", "/proc/sys/kernel/unprivileged_bpf_disabled"):
    print(path, open(path).read().strip() if os.path.exists(path) else "absent")
print("/sys/kernel/btf/vmlinux", os.path.exists("/sys/kernel/btf/vmlinux"))
PY
  [ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing 2>&1
  ls /sys/kernel/tracing/uprobe_events 2>&1
  command -v bpftrace || echo "no bpftrace on this image" ;;
gpm)
  section "GPM and MIG as NVML reports them"
  $PY - <<'PY'
import pynvml as nv
nv.nvmlInit()
for i in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    try:
        mig = nv.nvmlDeviceGetMigMode(h)
    except nv.NVMLError as exc:
        mig = f"n/a ({exc})"
    gpm = nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
    print(i, nv.nvmlDeviceGetName(h), "MIG (current, pending):", mig, "GPM supported:", bool(gpm))
PY
  ;;
tests)
  section "the GPU-facing tests (pytest -m gpu)"
  $PY -m pytest -q -s -m gpu -p no:cacheprovider $(grep -l 'mark.gpu' tests/test_*.py) 2>&1 | tail -40 ;;
cupti)
  section "CUPTI: NVIDIA's own sample profiles a PyTorch job"
  $PY -c "from importlib.metadata import version; from cupti import cupti; print('cupti-python', version('cupti-python'), 'timestamp', cupti.get_timestamp())" 2>&1 | tail -2
  cat > /tmp/tiny_job.py <<'PY'
import torch
a = torch.randn(1024, 1024, device="cuda"); torch.cuda.nvtx.range_push("step")
for _ in range(3): b = a @ a
torch.cuda.nvtx.range_pop(); torch.cuda.synchronize(); print("job done")
PY
  sample=$(ls /tmp/site/cupti-python-samples/cupyprof.py 2>/dev/null)
  [ -n "$sample" ] && (cd /tmp/site/cupti-python-samples && timeout 120 $PY cupyprof.py -a concurrent_kernel,runtime,marker,name \
     -o brief /tmp/tiny_job.py 2>&1 | head -60) ;;
esac; done
echo; echo "=== done ($(date -u +%H:%M:%S))"
