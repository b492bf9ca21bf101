"""The Monarch kernel speaks the Jupyter protocol: jupyter_kernel_test's checks."""

from __future__ import annotations

import pytest

import jupyter_kernel_test as jkt

from _kernel_helpers import install_kernelspec

pytestmark = pytest.mark.timeout(120)


class MonarchKernelTests(jkt.KernelTests):
    kernel_name = "monarch"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('boom')"
    code_execute_result = [{"code": "1+2+3", "result": "6"}, {"code": "[n*n for n in range(3)]",
                                                             "result": "[0, 1, 4]"}]
    code_display_data = [{"code": "from IPython.display import HTML, display; "
                                  "display(HTML('<b>test</b>'))", "mime": "text/html"}]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    @classmethod
    def setUpClass(cls) -> None:
        install_kernelspec()
        super().setUpClass()

    def test_monarch_implementation_and_magics_loaded(self) -> None:
        self.flush_channels()
        self.kc.kernel_info()
        reply = self.kc.get_shell_msg(timeout=jkt.TIMEOUT)
        assert reply["content"]["implementation"] == "monarch_kernel"
        assert "Monarch kernel" in reply["content"]["banner"]
        self.flush_channels()
        reply, outputs = self.execute_helper("%mesh --help")
        assert reply["content"]["status"] == "ok"
        text = "".join(o["content"].get("text", "") for o in outputs)
        assert "usage: %mesh COMMAND" in text
