"""``python -m imagenet_cog`` runs the command line (also under ``torchrun``)."""

from .cli import run

if __name__ == "__main__":
    raise SystemExit(run())
