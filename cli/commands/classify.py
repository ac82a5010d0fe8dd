"""``kvcast classify TEXT...``: the intent of each text, as a lone first-turn request."""

from __future__ import annotations

import logging
import sys

import click
import orjson

from kvcast.cli.options import TAXONOMY_CHOICE, backbone_options


@click.command("classify")
@click.argument("texts", nargs=-1, required=True)
@backbone_options
@click.option(
    "--head",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Trained head file (default: the head shipped for the backbone, else zero-shot).",
)
@click.option("--zero-shot", is_flag=True, help="Use the zero-shot head.")
@click.option(
    "--taxonomy", type=TAXONOMY_CHOICE, default="30", show_default=True, help="Categories."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {intent, confidence}.")
def classify_command(
    texts: tuple[str, ...],
    backbone: str | None,
    device: str | None,
    head: str | None,
    zero_shot: bool,
    taxonomy: str,
    as_json: bool,
) -> None:
    """Classify each TEXT into the intent taxonomy."""
    from kvcast.classifier.backbone import BackboneUnavailable
    from kvcast.classifier.head import HeadMismatch
    from kvcast.classifier.model import load_classifier

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        classifier = load_classifier(backbone, head, int(taxonomy), device, zero_shot)
    except (BackboneUnavailable, HeadMismatch) as exc:
        raise click.ClickException(str(exc)) from exc
    predictions = classifier.predict_texts(list(texts))
    if as_json:
        payload = [p.to_dict() for p in predictions]
        sys.stdout.buffer.write(orjson.dumps(payload) + b"\n")
        return
    for prediction in predictions:
        click.echo(f"{prediction.intent}\t{prediction.confidence:.3f}")
