"""syncbn_fixture.py — torch.nn.SyncBatchNorm's arithmetic for two ranks, for tests/test_syncbn.c.

    python3 tests/torch/syncbn_fixture.py [OUT]   (default tests/fixtures/syncbn.bin; needs a CUDA GPU:
                                                 the batch_norm_* ops SyncBatchNorm calls are CUDA ops)

torch's SyncBatchNorm (torch/nn/modules/_functions.py) runs, on every rank:
  forward   mean, invstd = batch_norm_stats(x); all_gather [mean, invstd, count] over the ranks;
            mean, invstd = batch_norm_gather_stats_with_counts(x, means, invstds, running_mean,
            running_var, momentum, eps, counts)  (which also updates the running statistics);
            y = batch_norm_elemt(x, weight, bias, mean, invstd, eps)
  backward  sum_dy, sum_dy_xmu, grad_weight, grad_bias = batch_norm_backward_reduce(dy, x, mean,
            invstd, weight, …); all_reduce(SUM) [sum_dy, sum_dy_xmu];
            dx = batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts)
This script makes those same calls for two ranks in one process: the all_gather is a stack of the two
ranks' rows, the all_reduce a sum, so only the transport is missing. It also checks its result
against F.batch_norm on the two ranks' batches together (what SyncBatchNorm is meant to equal).

One case: each rank holds 3 images of 5 channels, 4×6 (NCHW, fp32); rank 1's values are shifted and
wider, so each rank's own statistics differ from the pair's. weight, bias random; running_mean 0,
running_var 1 (BatchNorm2d's initial buffers), momentum 0.1, eps 1e-5.
Records: x [2,3,5,4,6], dy [2,3,5,4,6], weight [5], bias [5] (f32), y and dx [2,3,5,4,6],
running_mean and running_var [5] (after the step, the same on both ranks), grad_weight and grad_bias
[2,5] (each rank's own: DDP averages them afterwards). Written by fixtures.py.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402

R, N, C, H, W = 2, 3, 5, 4, 6
MOMENTUM, EPS = 0.1, 1e-5


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures",
                                                             "syncbn.bin")
    if not torch.cuda.is_available():
        sys.exit("syncbn_fixture.py: needs a CUDA GPU (SyncBatchNorm's batch_norm_* ops are CUDA ops)")
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(5)
    x = torch.rand(R, N, C, H, W, generator=g) * 2 - 1
    x[1] = x[1] * 3 + 2
    dy = torch.rand(R, N, C, H, W, generator=g) * 2 - 1
    weight = torch.rand(C, generator=g) + 0.5
    bias = torch.rand(C, generator=g) - 0.5
    xs, dys = [t.to(dev) for t in x], [t.to(dev) for t in dy]
    w, b = weight.to(dev), bias.to(dev)

    # forward: each rank's stats, "all-gathered"
    rows = []
    for r in range(R):
        mean, invstd = torch.batch_norm_stats(xs[r], EPS)
        count = torch.full((1,), xs[r].numel() // xs[r].size(1), dtype=mean.dtype, device=dev)
        rows.append(torch.cat([mean, invstd, count]))
    combined = torch.stack(rows)
    mean_all, invstd_all, count_all = torch.split(combined, C, dim=1)
    counts = count_all.view(-1)
    ys, dxs, gws, gbs, running = [], [], [], [], []
    saved = []
    for r in range(R):
        rm, rv = torch.zeros(C, device=dev), torch.ones(C, device=dev)
        mean, invstd = torch.batch_norm_gather_stats_with_counts(xs[r], mean_all, invstd_all, rm, rv, MOMENTUM, EPS,
                                                                 counts)
        ys.append(torch.batch_norm_elemt(xs[r], w, b, mean, invstd, EPS))
        running.append((rm, rv))
        saved.append((mean, invstd))
    # backward: each rank's sums, "all-reduced"
    reduced = []
    for r in range(R):
        mean, invstd = saved[r]
        sum_dy, sum_dy_xmu, gw, gb = torch.batch_norm_backward_reduce(dys[r], xs[r], mean, invstd, w, True, True,
                                                                       True)
        reduced.append(torch.cat([sum_dy, sum_dy_xmu]))
        gws.append(gw)
        gbs.append(gb)
    sum_dy, sum_dy_xmu = torch.split(reduced[0] + reduced[1], C)
    for r in range(R):
        mean, invstd = saved[r]
        dxs.append(torch.batch_norm_backward_elemt(dys[r], xs[r], mean, invstd, w, sum_dy, sum_dy_xmu,
                                                   count_all.to(torch.int32)))
    assert torch.equal(running[0][0], running[1][0]) and torch.equal(running[0][1], running[1][1])

    # what it must equal: batch norm over the two batches together (gradients of sum(y·dy))
    xa = torch.cat(xs).double().requires_grad_(True)
    wa, ba = w.double().requires_grad_(True), b.double().requires_grad_(True)
    rm, rv = torch.zeros(C, device=dev, dtype=torch.float64), torch.ones(C, device=dev, dtype=torch.float64)
    ya = F.batch_norm(xa, rm, rv, wa, ba, True, MOMENTUM, EPS)
    (ya * torch.cat(dys).double()).sum().backward()
    errs = {"y": (torch.cat(ys).double() - ya).abs().max(), "dx": (torch.cat(dxs).double() - xa.grad).abs().max(),
            "running_var": (running[0][1].double() - rv).abs().max(),
            "grad_weight": ((gws[0] + gws[1]).double() - wa.grad).abs().max()}
    for k, v in errs.items():
        print(f"syncbn_fixture: {k}: SyncBatchNorm's calls against one batch norm over both batches: {v.item():.3g}",
              file=sys.stderr)
        assert v.item() < 1e-4, k

    records = {"x": x.numpy(), "dy": dy.numpy(), "weight": weight.numpy(), "bias": bias.numpy(),
               "y": torch.stack(ys).cpu().numpy(), "dx": torch.stack(dxs).cpu().numpy(),
               "running_mean": running[0][0].cpu().numpy(), "running_var": running[0][1].cpu().numpy(),
               "grad_weight": torch.stack(gws).cpu().numpy(), "grad_bias": torch.stack(gbs).cpu().numpy()}
    fixtures.write(out, records)
    print(f"syncbn_fixture: wrote {out} (torch {torch.__version__})", file=sys.stderr)


if __name__ == "__main__":
    main()
