"""Leaf helpers every layer may use: text made safe to print, the wall clock, process groups,
package pins, version numbers. Nothing here imports from the rest of sleuth but `errors`, so
that a store, a GPU backend or a renderer can use them without reaching up a layer
(`make lint` checks the layers: docs/design.md)."""
