"""A C++ extension that does not build is reported with the compiler's messages at the candidate's own
lines, without ninja's command lines (about 600 characters each, twice)."""

from kernelscout.sandbox.build_errors import is_build_error, summarise

CANDIDATE = '''import torch
from torch.utils.cpp_extension import load_inline

_SRC = r"""
torch::Tensor run(torch::Tensor x) {
  auto out = torch::empty_like(x);
  out.fill_(undeclared_variable);
  return out
}
"""
_ext = load_inline(name="demo", cpp_sources=_SRC, functions=["run"])
'''


def test_a_failed_build_names_the_candidates_line_and_drops_the_commands(tmp_path):
    generated = tmp_path / "main.cpp"  # what load_inline writes: a header line, then the source
    generated.write_text("#include <torch/extension.h>\n" + CANDIDATE.split('r"""')[1].split('"""')[0])
    command = (f"c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=demo -isystem /torch/include -fPIC -std=c++20 "
               f"-c {generated} -o main.o ")
    log = (f"Error building extension 'demo': [1/2] {command}\nFAILED: main.o \n{command}\n"
           f"{generated}:5:13: error: 'undeclared_variable' was not declared in this scope\n"
           "    5 |   out.fill_(undeclared_variable);\n"
           f"{generated}:6:13: error: expected ';' before '}}' token\n"
           "ninja: build stopped: subcommand failed.")
    exc = RuntimeError(log)
    assert is_build_error(exc)
    told = summarise(str(exc), CANDIDATE, "/work/cand.py")
    assert told.startswith("the C++/CUDA extension 'demo' does not build")
    assert "-MMD" not in told and "FAILED" not in told and "ninja" not in told
    assert "'undeclared_variable' was not declared in this scope  [cand.py line 7]" in told
    assert "expected ';'" in told and "[cand.py line 8]" in told


def test_other_errors_are_left_as_they_are():
    assert not is_build_error(RuntimeError("CUDA out of memory"))
    assert summarise("something else\nentirely", "", "c.py") == "something else\nentirely"
