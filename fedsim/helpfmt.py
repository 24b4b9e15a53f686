"""The help formatter of `fedsim` commands: each option's help ends with its default, except
where a default says nothing (a required option, None, '', [], a switch that is off): argparse's
ArgumentDefaultsHelpFormatter would print "(default: None)" there."""

from __future__ import annotations

import argparse

SILENT = (None, "", [], False)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required and action.option_strings:
            return f"{text} (required)"
        if any(action.default is s or action.default == s and type(action.default) is type(s) for s in SILENT):
            return text
        return super()._get_help_string(action)
