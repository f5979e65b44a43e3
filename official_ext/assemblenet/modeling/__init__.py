"""AssembleNet++lite layers, backbone/model builders and complexity counts."""
