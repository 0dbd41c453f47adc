"""Vision: torchvision's image decoding, datasets and transforms on libjpeg-turbo, OpenCV and
numpy. Importing this package is cheap; the submodules import numpy, OpenCV and Pillow."""
