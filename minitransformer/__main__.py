"""``python -m minitransformer`` and the ``minitransformer`` command (``run``).

Importing the CLI imports PyTorch, which takes a second or more: a Ctrl-C then ends the
command with "interrupted" and exit code 130, as it does later on, not with a traceback.
"""

import sys


def run() -> int:
    try:
        from .cli import main
    except KeyboardInterrupt:
        print("minitransformer: interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
