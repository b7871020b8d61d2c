"""python -m ernie.train --config job.toml [--section.key value ...] [--dry-run]
[--plot PNG] [--print-config]

Runs a training job (ernie.train); every `--section.key value` overrides
that key of the config. Exit status: 0 when the job finished or was stopped
by SIGTERM / SIGINT after saving a checkpoint; 1 for a failure (its cause
on stderr); 2 for a bad command line or config.
"""

from __future__ import annotations

import json
import sys

from . import ConfigError, Trainer, TrainingStopped, load

USAGE = __doc__.split("\n\n")[0]


def parse(argv):
    """(config path, [(key, value)], flags) from the command line."""
    path, overrides, flags = None, [], {"dry_run": False, "print_config": False, "plot": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        if arg in ("--dry-run", "--print-config"):
            flags[arg[2:].replace("-", "_")] = True
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if not name.startswith("--") or len(name) == 2:
            raise ConfigError(f"{arg!r}: expected --config FILE or --section.key VALUE")
        if not eq:
            if i + 1 >= len(argv):
                raise ConfigError(f"{name} needs a value")
            value = argv[i + 1]
            i += 1
        i += 1
        if name == "--config":
            path = value
        elif name == "--plot":
            flags["plot"] = value
        else:
            overrides.append((name[2:], value))
    return path, overrides, flags


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        path, overrides, flags = parse(argv)
        if flags["plot"]:
            overrides.append(("metrics.plot", json.dumps(flags["plot"])))
        job = load(path, overrides)
    except ConfigError as e:
        print(f"ernie.train: {e}\n{USAGE}", file=sys.stderr)
        return 2
    if flags["print_config"]:
        print(json.dumps(job.to_dict(), indent=2))
        return 0
    try:
        return Trainer(job, dry_run=flags["dry_run"]).run()
    except ConfigError as e:
        print(f"ernie.train: {e}", file=sys.stderr)
        return 2
    except TrainingStopped as e:
        print(f"ernie.train: stopped: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError, RuntimeError) as e:
        print(f"ernie.train: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"ernie.train: interrupted: {e}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
