"""A five-minute tour of the xmodal library API on the embedded synthetic dataset.

Run: .venv/bin/python examples/tour.py   (about 10 s on 2 CPU cores)
"""
import torch

import xmodal
from xmodal import data, losses, metrics, normalize

torch.manual_seed(0)
splits = data.synthetic(seed=0)                       # {"train", "val", "test"}: PairedSplit
train, test = splits["train"], splits["test"]

# Two linear towers into a 64-d joint space, trained with NCL (Sinkhorn-biased InfoNCE).
video_head = torch.nn.Linear(train.video.shape[1], 64)
text_head = torch.nn.Linear(train.text.shape[1], 64)
loss_fn = losses.NCL(temperature=0.05, queue_size=4096)
opt = torch.optim.Adam([*video_head.parameters(), *text_head.parameters()], lr=1e-3)
video_all, text_all = torch.from_numpy(train.video), torch.from_numpy(train.text)
t2v = torch.from_numpy(train.text_to_video)
for step in range(300):
    rows = torch.randint(0, train.num_texts, (128,))
    ids = t2v[rows]                                       # several captions of one video are not negatives
    loss = loss_fn(video_head(video_all[ids]), text_head(text_all[rows]), ids=ids)
    opt.zero_grad()
    loss.backward()
    opt.step()

with torch.no_grad():
    v = torch.nn.functional.normalize(video_head(torch.from_numpy(test.video)), dim=1)
    t = torch.nn.functional.normalize(text_head(torch.from_numpy(test.text)), dim=1)
sim = t @ v.T                                             # [num_texts, num_videos]
before = metrics.text_video(sim, test.text_to_video)

# NCL test time: gallery biases fitted on the stored train text queries (no test query used).
text_bank, _ = loss_fn.query_bank()
sinkhorn = normalize.SinkhornBias(temperature=0.05).fit(text_bank, v)
after = metrics.text_video(sinkhorn(sim), test.text_to_video)
print(f"t2v R@1 {before['t2v']['R@1']:.1f} -> {after['t2v']['R@1']:.1f} with train-bank Sinkhorn biases")
print("normalization error:", round(metrics.normalization_error(sim, 0.05), 3), "->",
      round(metrics.normalization_error(sinkhorn(sim), 0.05), 3))

# The same evaluation streamed block by block from embeddings (never the full matrix).
streamed = metrics.streaming_text_video(t, v, test.text_to_video, t2v_bias=sinkhorn.bias)
assert streamed["t2v"] == after["t2v"]
print("EPIC-style mAP/nDCG with a 0/1 relevancy:", metrics.mir(sim, (test.text_to_video[:, None] ==
                                                                     torch.arange(test.num_videos).numpy())))
