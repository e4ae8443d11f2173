"""Qt-free models behind the Inspector views: documents, hex sources, tensor tables, statistics.
Importable and testable without PySide6."""
