"""Text that breaks naive tokenizer handling: used by every parity and losslessness test."""

HOSTILE_STRINGS = [
    "",
    " ",
    "hello world",
    "  leading and trailing spaces  ",
    "tabs\tand\t\ttabs",
    "windows\r\nline\r\nendings\r\n",
    "emoji 😀🎉👩‍👩‍👧 family",
    "中文字符和日本語のテキスト",
    "combining e\u0301 a\u0308 n\u0303 marks",
    "runs      of      spaces",
    "def f(x):\n    return x  # comment\n\n\n",
    "\x00\x01 control \x7f chars",
    "<0x41> looks like a byte token",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math and ﷽",
    "ünïcödé ÀÉÎÕÜ ß",
]
