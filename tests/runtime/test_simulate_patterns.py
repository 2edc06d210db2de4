"""td.simulate raises no false alarm on legal GPU code: a catalogue of common patterns.

Each case is code that runs on a real CUDA machine (checkpointing, attention, distributions,
losses with weights, masking, scatter/gather, norms, host transfers, autocast, RNN cells,
DataParallel, sparse gradients, ...). Under the simulation it must run without a device error
and leave its results on the virtual GPU.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchdoctor as td

dev = torch.device("cuda")


@pytest.fixture(autouse=True)
def _simulated() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with td.simulate("cuda", devices=2):
        yield
    torch.set_num_threads(before)


def test_checkpoint() -> None:
    """checkpoint"""
    lin = nn.Linear(8, 8).to(dev)
    x = torch.randn(4, 8, device=dev, requires_grad=True)
    for reentrant in (False, True):
        y = checkpoint(lambda t: torch.relu(lin(t)), x, use_reentrant=reentrant)
        y.sum().backward()
    assert x.grad is not None and x.grad.device.type == "cuda"
    assert lin.weight.grad is not None and lin.weight.grad.is_cuda


def test_mha() -> None:
    """mha"""
    mha = nn.MultiheadAttention(8, 2, batch_first=True).to(dev)
    q = torch.randn(2, 5, 8, device=dev)
    kpm = torch.zeros(2, 5, dtype=torch.bool, device=dev)
    kpm[:, -1] = True
    out, _ = mha(q, q, q, key_padding_mask=kpm)
    out.sum().backward()
    assert out.is_cuda
    mha.eval()
    with torch.no_grad():
        mha(q, q, q, key_padding_mask=kpm)


def test_sdpa() -> None:
    """sdpa"""
    q = torch.randn(2, 2, 5, 4, device=dev, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    m = torch.ones(5, 5, dtype=torch.bool, device=dev).tril()
    F.scaled_dot_product_attention(q, q, q, attn_mask=m)


def test_distributions() -> None:
    """distributions"""
    d = torch.distributions.Normal(torch.zeros(3, device=dev), torch.ones(3, device=dev))
    s = d.rsample()
    d.log_prob(s).sum()
    c = torch.distributions.Categorical(logits=torch.randn(4, 3, device=dev))
    c.sample()
    c.entropy()
    torch.distributions.Bernoulli(probs=torch.full((3,), 0.5, device=dev)).sample()


def test_interp_pad_grid() -> None:
    """interp/pad/grid"""
    im = torch.randn(1, 3, 8, 8, device=dev)
    F.interpolate(im, scale_factor=2, mode="bilinear")
    F.pad(im, (1, 1, 1, 1))
    theta = torch.eye(2, 3, device=dev)[None]
    grid = F.affine_grid(theta, im.shape, align_corners=False)
    F.grid_sample(im, grid, align_corners=False)


def test_einsum_matmul() -> None:
    """einsum/matmul"""
    a = torch.randn(2, 3, 4, device=dev)
    b = torch.randn(4, 5, device=dev)
    torch.einsum("bij,jk->bik", a, b)
    a @ b
    torch.bmm(a, a.transpose(1, 2))
    torch.matmul(a, b[None])


def test_dtypes_memory_format() -> None:
    """dtypes/memory format"""
    im = (
        torch.randn(2, 3, 4, 4)
        .cuda()
        .half()
        .float()
        .bfloat16()
        .to(memory_format=torch.channels_last)
    )
    conv = nn.Conv2d(3, 4, 3).to(dev, memory_format=torch.channels_last).bfloat16()
    conv(im)


def test_losses_with_weights() -> None:
    """losses with weights"""
    logits = torch.randn(6, 3, device=dev)
    t = torch.tensor([0, 1, 2, 0, 1, -100], device=dev)
    F.cross_entropy(
        logits,
        t,
        weight=torch.tensor([1.0, 2.0, 3.0], device=dev),
        ignore_index=-100,
        label_smoothing=0.1,
    )
    F.binary_cross_entropy_with_logits(
        logits, torch.rand(6, 3, device=dev), pos_weight=torch.ones(3, device=dev)
    )
    F.kl_div(logits.log_softmax(1), logits.softmax(1), reduction="batchmean")
    F.mse_loss(logits, torch.zeros_like(logits))
    F.smooth_l1_loss(logits, logits * 0)
    F.nll_loss(logits.log_softmax(1), t.clamp(min=0), reduction="none")
    nn.CTCLoss()(
        torch.randn(5, 2, 4, device=dev).log_softmax(2),
        torch.randint(1, 4, (2, 3), device=dev),
        torch.tensor([5, 5]),
        torch.tensor([3, 2]),
    )


def test_clip_vector_utils() -> None:
    """clip/vector utils"""
    m = nn.Linear(3, 3).to(dev)
    m(torch.randn(2, 3, device=dev)).sum().backward()
    nn.utils.clip_grad_value_(m.parameters(), 0.1)
    nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=False)
    v = nn.utils.parameters_to_vector(m.parameters())
    nn.utils.vector_to_parameters(v * 0.5, m.parameters())


def test_schedulers() -> None:
    """schedulers"""
    m = nn.Linear(3, 3).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    s = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    for _ in range(3):
        opt.step()
        s.step()
    opt2 = torch.optim.Adam(m.parameters(), lr=torch.tensor(0.01))
    m(torch.randn(2, 3, device=dev)).sum().backward()
    opt2.step()


def test_init() -> None:
    """init"""
    w = torch.empty(4, 4, device=dev)
    nn.init.kaiming_uniform_(w)
    nn.init.orthogonal_(w)
    nn.init.trunc_normal_(w)
    nn.init.xavier_normal_(w)
    nn.init.zeros_(w)


def test_save_load_file_weights_only() -> None:
    """save/load file weights_only"""
    m = nn.Linear(3, 3).to(dev)
    p = os.path.join(tempfile.mkdtemp(), "w.pt")
    torch.save(m.state_dict(), p)
    m.load_state_dict(torch.load(p, weights_only=True))
    m.load_state_dict(torch.load(p, map_location="cpu"))


def test_sort_topk_unique_nonzero_multinomial() -> None:
    """sort/topk/unique/nonzero/multinomial"""
    v = torch.randn(10, device=dev)
    torch.topk(v, 3)
    torch.sort(v)
    torch.unique(v.round())
    torch.nonzero(v > 0)
    torch.bincount(torch.randint(0, 5, (10,), device=dev))
    torch.multinomial(v.softmax(0), 3)
    torch.randperm(10, device=dev)
    torch.histc(v, 4)
    v.argsort()
    torch.searchsorted(v.sort().values, v)
    torch.bucketize(v, torch.tensor([-1.0, 0.0, 1.0], device=dev))
    torch.cumsum(v, 0)
    torch.logcumsumexp(v, 0)
    torch.quantile(v, 0.5)


def test_factories_from_device() -> None:
    """factories from device"""
    x = torch.randn(3, device=dev)
    assert (torch.tensor([1, 2, 3], device=x.device) + torch.arange(3, device=x.device)).is_cuda
    assert torch.full_like(x, 2.0).is_cuda
    assert (x.new_tensor([1.0]) * x).is_cuda
    torch.linspace(0, 1, 5, device=dev)
    torch.eye(3, device=dev)
    torch.ones(2, device=dev).normal_()


def test_masking_patterns() -> None:
    """masking patterns"""
    lengths = torch.tensor([3, 5, 2], device=dev)
    mask = torch.arange(5, device=dev)[None] < lengths[:, None]
    y = torch.randn(3, 5, device=dev)
    y[~mask] = 0.0
    y.masked_fill_(~mask, float("-inf")).softmax(-1)
    torch.where(mask, y, 0.0)
    y[mask].sum()


def test_scatter_gather_one_hot() -> None:
    """scatter/gather/one_hot"""
    idx = torch.randint(0, 4, (3, 1), device=dev)
    torch.zeros(3, 4, device=dev).scatter_(1, idx, 1.0)
    torch.randn(3, 4, device=dev).gather(1, idx)
    F.one_hot(idx.squeeze(1), 4).float() @ torch.randn(4, 2, device=dev)
    torch.zeros(4, device=dev).index_add_(0, idx.squeeze(1), torch.ones(3, device=dev))
    torch.zeros(4, device=dev).scatter_add_(0, idx.squeeze(1), torch.ones(3, device=dev))


def test_norms() -> None:
    """norms"""
    im = torch.randn(2, 4, 3, 3, device=dev)
    nn.GroupNorm(2, 4).to(dev)(im)
    nn.InstanceNorm2d(4).to(dev)(im)
    bn = nn.BatchNorm2d(4).to(dev).eval()
    bn(im)
    nn.Dropout2d().to(dev)(im)
    nn.LayerNorm(3).to(dev)(im)


def test_host_transfer() -> None:
    """host transfer"""
    v = torch.randn(3, device=dev, requires_grad=True)
    v.detach().cpu().numpy()
    v.detach().cpu().tolist()
    float(v.detach().sum())
    v.sum().item()
    int(torch.tensor(3, device=dev))
    bool((v > 0).any())
    cpu_table = torch.arange(10.0)
    cpu_table[int(torch.tensor(3, device=dev))]


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_autocast_bf16() -> None:
    """autocast bf16"""
    m = nn.Linear(4, 4).to(dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        m(torch.randn(2, 4, device=dev)).sum()
    with torch.cuda.amp.autocast():
        m(torch.randn(2, 4, device=dev))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_transformer_enc_dec() -> None:
    """transformer enc-dec"""
    t = nn.Transformer(8, 2, 1, 1, 16, batch_first=True).to(dev)
    src, tgt = torch.randn(2, 5, 8, device=dev), torch.randn(2, 4, 8, device=dev)
    mask = t.generate_square_subsequent_mask(4, device=dev)
    t(
        src,
        tgt,
        tgt_mask=mask,
        src_key_padding_mask=torch.zeros(2, 5, dtype=torch.bool, device=dev),
    ).sum().backward()
    t.eval()
    with torch.no_grad():
        t.encoder(src, src_key_padding_mask=torch.zeros(2, 5, dtype=torch.bool, device=dev))


def test_embedding_bag_max_norm() -> None:
    """embedding bag / max_norm"""
    eb = nn.EmbeddingBag(10, 3, mode="mean").to(dev)
    eb(torch.tensor([1, 2, 4, 5, 4], device=dev), torch.tensor([0, 2], device=dev))
    e = nn.Embedding(10, 3, max_norm=1.0, padding_idx=0).to(dev)
    e(torch.tensor([[0, 1, 2]], device=dev)).sum().backward()


def test_rnn_cells_gru() -> None:
    """rnn cells & gru"""
    cell = nn.LSTMCell(3, 4).to(dev)
    h = c = torch.zeros(2, 4, device=dev)
    for _ in range(3):
        h, c = cell(torch.randn(2, 3, device=dev), (h, c))
    h.sum().backward()
    g = nn.GRU(3, 4, 2, bidirectional=True).to(dev)
    o, hn = g(torch.randn(5, 2, 3, device=dev))
    o.sum().backward()
    assert o.is_cuda and hn.is_cuda and g.weight_hh_l0.grad is not None
    assert g.weight_hh_l0.grad.is_cuda
    nn.RNN(3, 4).to(dev)(torch.randn(5, 2, 3, device=dev))[0].mean().backward()


def test_deepcopy_state_dict_copy() -> None:
    """deepcopy / state_dict copy"""
    m = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).to(dev)
    m2 = copy.deepcopy(m)
    m2.load_state_dict(m.state_dict())
    m2(torch.randn(4, 3, device=dev))
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    m.load_state_dict(sd)


def test_dataparallel_1_device() -> None:
    """DataParallel 1 device"""
    dp = nn.DataParallel(nn.Linear(3, 2).to(dev))
    dp(torch.randn(4, 3, device=dev)).sum().backward()


def test_complex_fft() -> None:
    """complex / fft"""
    s = torch.randn(16, device=dev)
    torch.fft.rfft(s).abs()
    torch.stft(s, 8, window=torch.hann_window(8, device=dev), return_complex=True)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_torch_cuda_amp_gradscaler_legacy_fused_adam() -> None:
    """torch.cuda.amp.GradScaler legacy + fused adam"""
    m = nn.Linear(4, 4).to(dev)
    opt = torch.optim.AdamW(m.parameters(), fused=True)
    sc = torch.cuda.amp.GradScaler()
    sc.scale(m(torch.randn(2, 4, device=dev)).sum()).backward()
    sc.step(opt)
    sc.update()


def test_nonzero_boolean_index_assign_tensor() -> None:
    """nonzero / boolean index assign tensor"""
    v = torch.zeros(5, device=dev)
    idx = (v == 0).nonzero().squeeze(1)
    v[idx] = torch.arange(5.0, device=dev)
    v.index_put_((idx,), torch.ones(5, device=dev), accumulate=True)
    v.index_fill_(0, idx, 2.0)
    v.index_select(0, idx)


def test_sparse_grads() -> None:
    """sparse grads"""
    e = nn.Embedding(10, 3, sparse=True).to(dev)
    e(torch.tensor([1, 2], device=dev)).sum().backward()
    torch.optim.SGD(e.parameters(), lr=0.1).step()


def test_lazy_modules() -> None:
    """lazy modules materialize on the virtual GPU"""
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2)).to(dev)
    out = model(torch.randn(3, 5, device=dev))
    out.sum().backward()
    assert out.is_cuda and model[0].weight.is_cuda
    assert model[0].weight.grad is not None and model[0].weight.grad.is_cuda
