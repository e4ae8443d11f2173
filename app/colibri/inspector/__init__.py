"""Colibri Inspector: the Qt desktop application (views, windows, workers). Model logic lives in
`colibri.inspection` and the engine; nothing here computes what it shows."""
