"""``python -m ddpdoctor``: the same as the ``ddpdoctor`` command."""

from ddpdoctor.cli import main

main()
