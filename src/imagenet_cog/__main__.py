"""``python -m imagenet_cog`` runs the command line (also under ``torchrun``)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
