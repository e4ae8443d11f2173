"""The prompt field of the debugger and the jitter lab, and the one rule for reading a prompt.

A prompt's leading space, tab or trailing newline changes its tokens, so `QtPromptEdit` shows
every space, tab and line break (Qt's whitespace markers) and keeps line breaks (a code prompt
has them). `token_ids(text)` is the rule both views share: text that is only token ids
separated by commas (`3, 4, 5`) is those ids; anything else goes through the model's tokenizer,
and a model without one says so instead of running an empty prompt.
"""

from __future__ import annotations

from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from colibri.tokens import parse_token_ids

NO_TOKENIZER = ("this model has no tokenizer: enter token ids separated by commas, "
                "e.g. 1, 2, 3")


def token_ids(text: str) -> list[int] | None:
    """The ids of a prompt written as token ids ('3, 4, 5': colibri.tokens.parse_token_ids), or
    None for prompt text."""
    if not text.strip():
        return None
    try:
        return parse_token_ids(text)
    except ValueError:
        return None


def placeholder(has_tokenizer: bool) -> str:
    """What an empty prompt field says it accepts."""
    if has_tokenizer:
        return "prompt text (spaces and line breaks count), or token ids: 1, 2, 3"
    return "this model has no tokenizer: token ids separated by commas, e.g. 1, 2, 3"


class QtPromptEdit(QPlainTextEdit):
    """A few lines of prompt with whitespace shown; `text()`/`setText()` as a QLineEdit has."""

    def __init__(self, parent: QWidget | None = None, lines: int = 2) -> None:
        super().__init__(parent)
        option = self.document().defaultTextOption()
        option.setFlags(option.flags() | QTextOption.Flag.ShowTabsAndSpaces
                        | QTextOption.Flag.ShowLineAndParagraphSeparators)
        self.document().setDefaultTextOption(option)
        self.setTabChangesFocus(True)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        margins = self.contentsMargins()
        self.setFixedHeight(self.fontMetrics().lineSpacing() * lines
                            + 2 * int(self.document().documentMargin())
                            + margins.top() + margins.bottom() + 2 * self.frameWidth())

    def text(self) -> str:
        return self.toPlainText()

    def setText(self, text: str) -> None:  # noqa: N802 (QLineEdit's name)
        self.setPlainText(text)


def example_prompt(model: object) -> str:
    """The prompt a model file suggests for itself (user metadata `demo.prompts`, which the
    bundled demo carries), or ''."""
    metadata = getattr(model, "metadata", None)
    user = metadata.get("user") if isinstance(metadata, dict) else None
    demo = user.get("demo") if isinstance(user, dict) else None
    prompts = demo.get("prompts") if isinstance(demo, dict) else None
    first = prompts[0] if isinstance(prompts, list) and prompts else ""
    return first if isinstance(first, str) else ""


class QtTokenPieces(QPlainTextEdit):
    """The prompt's tokens (`'piece':id ...`), read-only, two lines tall and scrolling beyond:
    a long prompt never pushes the form off the screen or gets cut off."""

    def __init__(self, parent: QWidget | None = None, lines: int = 2) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setFrameShape(QPlainTextEdit.Shape.NoFrame)
        self.viewport().setAutoFillBackground(False)
        margins = self.contentsMargins()
        self.setFixedHeight(self.fontMetrics().lineSpacing() * lines
                            + 2 * int(self.document().documentMargin())
                            + margins.top() + margins.bottom())

    def text(self) -> str:
        return self.toPlainText()

    def setText(self, text: str) -> None:  # noqa: N802 (QLabel's name)
        self.setPlainText(text)
