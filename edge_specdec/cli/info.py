"""`edge-specdec info`: validate a bundle and show what is inside."""
from __future__ import annotations

import argparse
import json
import sys

from ..demo import DEMO_BUNDLE, is_demo


def template_features(folder, file=None) -> list[str]:
    """What a chat template (a model folder's, or `file`) lets a conversation hold, as `info` says it: tool calls
    in a format the runtime reads, and a system message."""
    from ..errors import EdgeSpecdecError
    from ..runtime.chat import ChatTemplate
    from ..runtime.tool_calls import tool_format

    try:
        template = ChatTemplate.from_model_folder(folder, file)
    except EdgeSpecdecError as exc:
        return [str(exc)]
    found = tool_format(template.source)
    tools = (f"tools: yes, {found.name} calls ({found.open.strip()} ... {found.close.strip()}); tool_choice "
             f"required or a named function makes the model call one" if found else
             "tools: no (a request with tools gets 400; serve --chat-template FILE takes a template that has them)")
    system = ("system message: yes" if template.accepts_system_message() else
              "system message: no (the template refuses one, or leaves it out)")
    return [tools, system]


def _cmd_info(args: argparse.Namespace) -> int:
    from ..bundle import describe, load_bundle, rehash_bundle
    from ..errors import EdgeSpecdecError

    if args.rehash:
        if args.bundle is None:
            raise EdgeSpecdecError("--rehash records the files of the bundle you name: edge-specdec info DIR --rehash")
        changes = rehash_bundle(args.bundle)
        print("\n".join(changes) + f"\nrecorded in {args.bundle}/manifest.json" if changes else
              "nothing changed: the manifest already records every file as it is",
              file=sys.stderr if args.json else sys.stdout)  # --json: stdout holds the manifest alone
    bundle = load_bundle(args.bundle or DEMO_BUNDLE, verify=not args.no_verify,
                         progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(bundle.manifest, indent=2, ensure_ascii=False))
    else:
        print(describe(bundle, template_features) + ("\n(the demo pair that ships with edge-specdec)" if is_demo(bundle.path) else ""))
        print("checksums verified" if not args.no_verify else "checksums not verified (--no-verify)")
    return 0


def add_parser(sub) -> None:
    """The `info` subcommand."""
    p = sub.add_parser("info", help="validate a bundle and show what is inside",
                       description="Validate a bundle (files present, sizes and sha256 checksums) and print a summary.",
                       epilog="examples:\n  edge-specdec info                      # the demo pair that ships with "
                              "edge-specdec\n  edge-specdec info bundles/qwen-smol\n  edge-specdec info "
                              "bundles/qwen-smol --json | jq .vocabulary\n  edge-specdec info "
                              "bundles/qwen-smol --rehash   # after editing target/chat_template.jinja",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", nargs="?",
                   help=f"a bundle folder written by `edge-specdec export` (default: the demo, {DEMO_BUNDLE})")
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 checks (sizes are still checked)")
    p.add_argument("--rehash", action="store_true",
                   help="after a deliberate edit of a bundle's files (a chat template, say): record every file's "
                        "sha256 and size as they are now in its manifest, print what changed, then verify")
    p.set_defaults(func=_cmd_info)
