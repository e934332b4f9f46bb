"""The FaSTPod controller (``fastgshare-controller``): turns each FaSTPod into its pods.

Built in issue 8; only the package boundary exists now.
"""
