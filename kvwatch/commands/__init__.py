"""One module per sub-command: add_parser(subparsers) and the function it sets as `func`."""
