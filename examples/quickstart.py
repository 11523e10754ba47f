"""The library API in a few lines: train CurricularFace on digits with a 3-D embedding,
evaluate it, and draw the sphere. Run: ``python examples/quickstart.py`` (writes runs/quickstart).
"""

from marginface.plots import plot_embeddings, save_figure
from marginface.train import evaluate_run, train
from marginface.train.config import TrainConfig

config = TrainConfig(
    dataset="digits",
    model="seed-cnn-bn",
    model_options={"dropout": 0.1},
    loss="curricularface",
    epochs=20,
    batch_size=64,
    lr=3e-3,
    schedule="cosine",
    threads=1,
)
trainer = train(config, "runs/quickstart", overwrite=True)  # history.csv, checkpoint.pt
result = evaluate_run("runs/quickstart")  # accuracy, verification, P@1
print({k: round(v, 4) for k, v in result.metrics.items() if k in ("accuracy", "auc", "eer")})
save_figure(
    plot_embeddings(result.embeddings, result.labels, title="CurricularFace"),
    "runs/quickstart/sphere.png",
)
