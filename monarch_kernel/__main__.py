"""`python -m monarch_kernel install ...` installs the kernelspec; otherwise starts the kernel."""

import sys

__all__ = ["main"]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "install":
        from monarch_kernel.install import main as install_main

        sys.exit(install_main(sys.argv[2:]))
    # Like ipykernel_launcher: keep the launch directory off sys.path while loading;
    # IPython puts the notebook's working directory back when the shell starts.
    from pathlib import Path

    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]
    from monarch_kernel.kernel import launch

    launch()


if __name__ == "__main__":
    main()
