exec cat -- "$HOME"/'dispatch out/s2.manifest'
