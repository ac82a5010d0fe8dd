"""``kvcast train-head DATA.jsonl --out HEAD``: train the MLP head on labelled requests."""

from __future__ import annotations

import logging
import sys

import click
import orjson

from kvcast.cli.options import TAXONOMY_CHOICE, Ints, backbone_options


def _table(title: str, report: dict) -> str:
    lines = [
        f"{title}: accuracy {report['accuracy']:.3f} (± {report['accuracy_se']:.3f}), "
        f"macro-F1 {report['macro_f1']:.3f}, n={report['n']}",
        f"  {'class':<36} {'prec':>5} {'rec':>5} {'f1':>5} {'n':>4}",
    ]
    for label, row in report["per_class"].items():
        lines.append(
            f"  {label:<36} {row['precision']:5.2f} {row['recall']:5.2f} {row['f1']:5.2f} "
            f"{row['support']:4d}"
        )
    return "\n".join(lines)


@click.command("train-head")
@click.argument("data", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Head file to write.")
@click.option(
    "--taxonomy", type=TAXONOMY_CHOICE, default="30", show_default=True, help="Categories."
)
@backbone_options
@click.option("--epochs", type=Ints(min=1), default=25, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Split and training seed.")
@click.option(
    "--no-examples",
    is_flag=True,
    help="Train on DATA only, without the taxonomy's example requests and descriptions.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
def train_head_command(
    data: str,
    out: str,
    taxonomy: str,
    backbone: str | None,
    device: str | None,
    epochs: int,
    seed: int,
    no_examples: bool,
    as_json: bool,
) -> None:
    """Train a head on DATA (JSONL of {intent, text|turns|messages[, split]}).

    Stratified 80/10/10 split unless every record has a ``split``; AdamW lr 3e-3, weight
    decay 0.01, dropout 0.25, cosine schedule with 5% warm-up; the epoch with the best
    validation macro-F1 is kept. Metrics per class on the validation and test parts.
    """
    from kvcast.classifier.backbone import BackboneUnavailable, load_backbone
    from kvcast.classifier.fit import fit_file
    from kvcast.classifier.head import save_head
    from kvcast.classifier.train import TrainConfig

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        encoder = load_backbone(backbone, device)
        result = fit_file(
            data,
            encoder,
            int(taxonomy),
            TrainConfig(epochs=epochs, seed=seed),
            with_examples=not no_examples,
            seed=seed,
        )
    except (BackboneUnavailable, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    path = save_head(result.head, out)
    summary = result.to_dict()
    summary["out"] = str(path)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
        return
    click.echo(
        f"backbone {summary['backbone']} ({summary['dim']}-dim), {summary['taxonomy']} classes, "
        f"split {summary['counts']}, best epoch {summary['best_epoch']}"
    )
    click.echo(_table("validation", summary["val"]))
    if summary["test"]:
        click.echo(_table("test (held out)", summary["test"]))
        click.echo(_table("zero-shot on test", summary["zero_shot_test"]))
        gain, se = summary["test_gain"]
        click.echo(f"trained - zero-shot accuracy on test: {gain:+.3f} (± {se:.3f})")
    click.echo(f"wrote {path}")
