# bench_ddp_env.sh — sourced by the DDP bench scripts (bench_stage3.sh, bench_stage4.sh): how many
# GPUs, which communicator the two-worker rows use, the PyTorch launcher, ports and log lines.
# Sets HAVE_TORCH, NGPU, COMM (nccl | host), BACKEND (PyTorch's: nccl | gloo), MODE, TORCHRUN, PORT;
# defines next_port and log. With one GPU the two workers share it through --comm host (PyTorch:
# gloo), and a note says the timings then show the mechanics, not scaling.
HAVE_TORCH=0
python3 -c "import torch" 2>/dev/null && HAVE_TORCH=1
if [ "$HAVE_TORCH" = 1 ]; then
    NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    NGPU=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
else
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
if [ "$NGPU" -ge 2 ]; then
    COMM=nccl; BACKEND=nccl; MODE="2 GPUs"
else
    COMM=host; BACKEND=gloo; MODE="2 workers on 1 GPU"
    echo "note: $NGPU GPU visible — the two-worker rows share it with --comm host (PyTorch DDP: two processes"
    echo "      with gloo): the DDP path is exercised and counted, but these timings do not show scaling"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1 | sed "s/^/gpu: /;s/$/ (x$NGPU)/"
TORCHRUN=$(command -v torchrun || echo "python3 -m torch.distributed.run")
PORT=$((20000 + $$ % 10000)) # below the ephemeral range; a different port for every run below
next_port() { PORT=$((PORT + 10)); }
log() { echo "=== $* ($(date +%T))"; }
