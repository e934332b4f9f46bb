"""The PyTorch programs the GPU day runs under the hook (``fastgshare run``): any user's programs,
importing nothing of the project. Alone in this directory so that, run as scripts, the directory
Python puts first on their path holds no module a framework could mistake for its own."""
