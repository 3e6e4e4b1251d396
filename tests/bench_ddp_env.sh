# bench_ddp_env.sh — sourced by the DDP bench scripts (bench_stage3.sh, bench_stage3_variants.sh,
# bench_stage4.sh, bench_unused.sh) after tests/bench_common.sh and its bench_gpus (NGPU): which
# communicator the two-worker rows use, the PyTorch launcher, ports and log lines.
# Sets HAVE_TORCH, COMM (nccl | host), BACKEND (PyTorch's: nccl | gloo), MODE, TORCHRUN, PORT;
# defines next_port and log. With one GPU the two workers share it through --comm host (PyTorch:
# gloo), and a note says the timings then show the mechanics, not scaling. With none (only the CPU
# smoke tests get this far: the scripts refuse otherwise) the workers run on the CPU and PyTorch's
# rows, which are written for CUDA, are left out.
# shellcheck shell=bash
[ -n "${NGPU:-}" ] || bench_gpus
HAVE_TORCH=0
[ "$NGPU" -ge 1 ] && python3 -c "import torch" 2>/dev/null && HAVE_TORCH=1
if [ "$NGPU" -ge 2 ]; then
    COMM=nccl; BACKEND=nccl; MODE="2 GPUs"
elif [ "$NGPU" = 1 ]; then
    COMM=host; BACKEND=gloo; MODE="2 workers on 1 GPU"
    echo "note: 1 GPU visible — the two-worker rows share it with --comm host (PyTorch DDP: two processes"
    echo "      with gloo): the DDP path is exercised and counted, but these timings do not show scaling"
else
    COMM=host; BACKEND=gloo; MODE="2 workers on the CPU"
    echo "note: no GPU visible ($GPU_HOW) — the CPU smoke test: two workers on the CPU with --comm host,"
    echo "      no PyTorch rows; it checks that the script runs, its timings say nothing"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1 | sed "s/^/gpu: /;s/$/ (x$NGPU)/"
TORCHRUN=$(command -v torchrun || echo "python3 -m torch.distributed.run")
PORT=$((20000 + $$ % 10000)) # below the ephemeral range; a different port for every run below
next_port() { PORT=$((PORT + 10)); }
log() { echo "=== $* ($(date +%T))"; }
