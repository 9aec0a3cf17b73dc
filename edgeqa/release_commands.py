"""``edgeqa release``: look at, compare, explain and roll back releases (``precompute/releases.py``,
``edge_index/lookup.py`` ``explain``); each prints text, or JSON with ``--json``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from base.languages import DEFAULT_LANGUAGE, LANGUAGES, language_of
from edgeqa.libraries import quiet_libraries

if TYPE_CHECKING:
    from base.manifest import Threshold
    from edge_index.explain import Explanation
    from precompute.views import ReleaseDiff, ReleaseSummary, ReleaseView


def add_release_commands(commands: Any) -> None:
    """The ``release`` command and its subcommands, on ``edgeqa``'s subparsers."""
    release = commands.add_parser(
        "release", help="look at, compare, explain and roll back releases"
    )
    release_commands = release.add_subparsers(dest="release_command", required=True)

    def release_command(name: str, help_: str, run: Callable[[argparse.Namespace], int]) -> Any:
        command = release_commands.add_parser(name, help=help_)
        command.add_argument("--store", default=None, help="store root (default: EDGEQA_STORE)")
        command.add_argument(
            "--profile",
            default=None,
            help="default: EDGEQA_PROFILE, else the newest of --language, else the only one",
        )
        command.add_argument(
            "--language",
            choices=LANGUAGES,
            default=None,
            help="the language profile (explain: the question's own by default)",
        )
        command.add_argument("--json", action="store_true", help="print JSON")
        command.set_defaults(run=run)
        return command

    release_command("list", "the kept releases, the current one marked", _cmd_release_list)
    show = release_command(
        "show", "one release: counts, exclusions, calibration, top questions", _cmd_release_show
    )
    show.add_argument("version", nargs="?", default=None, help="default: the current one")
    show.add_argument("--top", type=int, default=20, help="most asked questions to list")
    show.add_argument(
        "--html", default=None, help="also write a self-contained page (charts, tables) here"
    )
    diff = release_command("diff", "what changed between two releases", _cmd_release_diff)
    diff.add_argument("old")
    diff.add_argument("new")
    explain = release_command(
        "explain", "how the edge decides a question, step by step", _cmd_release_explain
    )
    explain.add_argument("question")
    explain.add_argument("--version", default=None, help="default: the current release")
    rollback = release_command(
        "rollback", "make a kept release current again", _cmd_release_rollback
    )
    rollback.add_argument("version")
    release_command(
        "renew",
        "sign the current pointer again with a fresh expiry (nothing else changes)",
        _cmd_release_renew,
    )
    revoke = release_command(
        "revoke",
        "take a published answer down everywhere: recorded, and a release published without it",
        _cmd_release_revoke,
    )
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--question", help="a published phrasing (its cluster is revoked)")
    which.add_argument("--key", help="a phrasing's key")
    which.add_argument("--cluster", help="a cluster id (edgeqa release explain shows it)")
    revoke.add_argument("--reason", required=True, help="why (kept in the audit log)")
    revoke.add_argument("--by", default=None, help="who (default: the login name)")
    unrevoke = release_command(
        "unrevoke",
        "end a revocation (the next nightly build may publish it again)",
        _cmd_release_unrevoke,
    )
    ended = unrevoke.add_mutually_exclusive_group(required=True)
    ended.add_argument("--id", dest="entry", help="the revocation's id")
    ended.add_argument("--key", help="a revoked phrasing's key")
    ended.add_argument("--cluster", help="the revoked cluster")
    unrevoke.add_argument("--reason", required=True, help="why (kept in the audit log)")
    unrevoke.add_argument("--by", default=None, help="who (default: the login name)")


def _release_context(args: argparse.Namespace, writes: bool = False) -> tuple[Any, Any, str]:
    """(settings, store, profile) of an ``edgeqa release`` command; ``writes``: the nightly
    job's settings (the signing key, the releases kept)."""
    from base.config import SharedSettings
    from base.store import open_store
    from edge_index.profiles import resolve_profile
    from precompute.config import PrecomputeSettings

    kind = PrecomputeSettings if writes else SharedSettings
    settings = kind.from_env(store=args.store, profile=args.profile)
    store = open_store(settings.store)
    names = settings.profile_names
    if len(names) == 1:
        return settings, store, names[0]
    language = args.language
    if language is None and getattr(args, "question", None):
        language = language_of(args.question)
    return settings, store, resolve_profile(store, None, language, names)


def _print(args: argparse.Namespace, value: Any, text: Callable[[Any], str]) -> None:
    """``--json``: the value as JSON (a view, or views: ``as_json``); else the human text."""
    from precompute.views import as_json

    print(json.dumps(as_json(value), indent=2, default=str) if args.json else text(value))


def _cmd_release_list(args: argparse.Namespace) -> int:
    from precompute.releases import list_releases
    from precompute.views import describe_semantic_tier

    _, store, profile = _release_context(args)
    listed = list_releases(store, profile)

    def text(rows: list[ReleaseSummary]) -> str:
        lines = [f"{profile}: {len(rows)} kept release(s)"]
        for r in rows:
            c = r.calibration
            lines.append(
                f"{'*' if r.current else ' '} {r.version}  created {r.created_at}  "
                f"parent {r.parent or '-'}  {r.entries} entries  "
                f"{describe_semantic_tier(c)}  threshold {c.value} "
                f"(precision {c.precision})  signed {r.signed_by or 'no'}"
            )
        return "\n".join(lines)

    _print(args, listed, text)
    return 0


def _cmd_release_show(args: argparse.Namespace) -> int:
    from precompute.releases import show_release
    from precompute.views import describe_semantic_tier

    settings, store, profile = _release_context(args)
    shown = show_release(store, profile, args.version, settings.public_keys, top=args.top)
    if args.html:
        from pathlib import Path

        from base.release import list_versions
        from precompute.releases import diff_releases
        from precompute.report import render_html

        diff = None
        if shown.parent in list_versions(store, profile):
            keys = settings.public_keys
            diff = diff_releases(store, profile, shown.parent, shown.version, keys)
        Path(args.html).write_text(render_html(shown, diff), encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)

    def text(r: ReleaseView) -> str:
        lines = [
            f"{profile}/{r.version}{' (current)' if r.current else ''}: created "
            f"{r.created_at}, parent {r.parent or '-'}, runner {r.runner}",
            f"counts: {r.counts.as_dict()}",
            f"excluded rows (mining): {r.excluded.rows}",
            f"excluded clusters (generation, build): {r.excluded.clusters}",
            describe_semantic_tier(r.calibration),
            f"calibration: {_calibration_line(r.calibration)}",
            f"embedder: {r.embedder.as_dict()}",
            "top questions:",
        ]
        lines += [f"  {q.hits:>6} hits  {q.question}" for q in r.top_questions]
        return "\n".join(lines)

    _print(args, shown, text)
    return 0


def _calibration_line(c: Threshold) -> str:
    return (
        f"threshold {c.value}, margin {c.margin}, agreement {c.agreement}, "
        f"precision {c.precision}, hit rate {c.hit_rate}, calibrated {c.calibrated}"
    )


def _cmd_release_diff(args: argparse.Namespace) -> int:
    from precompute.releases import diff_releases

    settings, store, profile = _release_context(args)
    diff = diff_releases(store, profile, args.old, args.new, settings.public_keys)

    def text(d: ReleaseDiff) -> str:
        lines = [f"{d.old} -> {d.new}: {d.counts.model_dump()}"]
        lines += [f"+ {c.question}" for c in d.added]
        lines += [f"- {c.question}" for c in d.dropped]
        lines += [f"~ {c.question}" for c in d.changed]
        lines.append(f"calibration: {_calibration_line(d.calibration.old)}")
        lines.append(f"         ->  {_calibration_line(d.calibration.new)}")
        return "\n".join(lines)

    _print(args, diff, text)
    return 0


def _cmd_release_explain(args: argparse.Namespace) -> int:
    quiet_libraries()
    from edge_index.profiles import load_index, profile_language
    from semantic.loading import load_embedder

    settings, store, profile = _release_context(args)
    language = profile_language(store, profile)
    spec = settings.embedders.get(language[0] if language else DEFAULT_LANGUAGE, "embedded")
    embedder = load_embedder(spec, settings.device, settings.cache_dir)
    index = load_index(store, profile, embedder, settings.public_keys, spec, args.version)
    explained = index.explain(args.question)

    def text(e: Explanation) -> str:
        outcome, exact = e.outcome, e.exact
        lines = [
            f"{e.version}: {e.query!r} -> normalized {e.normalized!r}, key {e.key}",
            f"exact tier: {'published' if exact.published else 'not published'}"
            + (" (revoked)" if exact.revoked else "")
            + (" (expired)" if exact.published and not exact.served else ""),
            "nearest phrasings:",
        ]
        lines += [f"  {c.score:.4f}  {c.question}" for c in e.candidates]
        if e.features is not None:
            f, d = e.features, e.decision
            lines.append(
                f"score {f.score:.4f} (>= {d.threshold}), margin {f.margin:.4f} "
                f"(>= {d.margin}), agreement {f.agreement:.2f} (>= {d.agreement})"
            )
        if e.guard is not None:
            lines.append(f"guard: {e.guard}")
        if outcome.hit:
            lines.append(f"decision: {outcome.tier} hit -> {outcome.question!r}")
        else:
            lines.append(f"decision: miss ({outcome.reason})")
        return "\n".join(lines)

    _print(args, explained, text)
    return 0


def _cmd_release_rollback(args: argparse.Namespace) -> int:
    from precompute.releases import rollback

    settings, store, profile = _release_context(args, writes=True)
    done = rollback(
        store,
        profile,
        args.version,
        settings.public_keys,
        settings.signer(),
        settings.pointer_expires_s,
        settings.high_water(),
    )
    _print(args, done, lambda d: f"{profile}: {d['status']} ({d['previous']} -> {d['version']})")
    return 0


def _cmd_release_renew(args: argparse.Namespace) -> int:
    from precompute.releases import renew

    settings, store, profile = _release_context(args, writes=True)
    done = renew(
        store,
        profile,
        settings.signer(),
        settings.public_keys,
        settings.pointer_expires_s,
        settings.high_water(),
    )

    def text(d: dict[str, Any]) -> str:
        return (
            f"{profile}: {d['version']} signed again (sequence {d['sequence']}), "
            f"fresh until {d['not_after']}"
        )

    _print(args, done, text)
    return 0


def _operator(args: argparse.Namespace) -> str:
    import getpass

    return str(args.by or getpass.getuser())


def _cmd_release_revoke(args: argparse.Namespace) -> int:
    from precompute.revocations import revoke

    settings, store, profile = _release_context(args, writes=True)
    done = revoke(
        store,
        profile,
        args.reason,
        _operator(args),
        question=args.question,
        key=args.key,
        cluster=args.cluster,
        signer=settings.signer(),
        public_keys=settings.public_keys,
        keep=settings.keep_releases,
        expires_s=settings.pointer_expires_s,
        high_water=settings.high_water(),
    )

    def text(d: dict[str, Any]) -> str:
        return (
            f"{profile}: revoked {d['id']} ({d['phrasings']} phrasing(s) of {d['question']!r}); "
            f"recorded in {d['recorded_s']} s, {d['version']} published without it in "
            f"{d['seconds']} s. Browsers drop it within their pointer TTL, the edge and the "
            "origin at their next poll."
        )

    _print(args, done, text)
    return 0


def _cmd_release_unrevoke(args: argparse.Namespace) -> int:
    from precompute.revocations import unrevoke

    settings, store, profile = _release_context(args, writes=True)
    done = unrevoke(
        store,
        profile,
        args.reason,
        _operator(args),
        entry=args.entry,
        key=args.key,
        cluster=args.cluster,
        signer=settings.signer(),
        public_keys=settings.public_keys,
        high_water=settings.high_water(),
    )
    _print(args, done, lambda d: f"{profile}: ended {', '.join(d['ended'])}")
    return 0
