// py_helper.cc — the Python helper of py_helper.h: its script, the child
// process and its frames.
#include "tools/py_helper.h"

#include <cjson/cJSON.h>

#include "tools/hf_tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace ts_prepare {

namespace {

// The helper. Modes:
//   encode FILE SPECIAL NAME...: loads tokenizer.json FILE, writes its
//                  vocabulary size and the id of each token NAME
//                  (0xFFFFFFFF: none), then per batch read (n, then
//                  n x (len, UTF-8 bytes)) writes n x (count, ids) from
//                  encode_batch, with the special tokens when SPECIAL is
//                  "1", no truncation, no padding (what transformers'
//                  tokenizer call does).
//   parquet FILE FIELD: writes each value of column FIELD as (len, bytes),
//                  then 0xFFFFFFFF.
// An error is one line on stderr and exit 1.
const char kScript[] = R"PY(
import struct, sys
def fail(msg):
    sys.stderr.write(msg.replace("\n", " ") + "\n"); sys.stderr.flush(); sys.exit(1)
def first(e):
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__
out = sys.stdout.buffer
mode, what = sys.argv[1], sys.argv[2]
def load_tokenizer():  # tokenizer.json sys.argv[3], as transformers calls it: no truncation, no padding
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        fail("%s: needs the Python package tokenizers (%s)" % (what, first(e)))
    try:
        tok = Tokenizer.from_file(sys.argv[3])
    except Exception as e:
        fail("%s: tokenizer.json: %s, expected a tokenizer.json of Hugging Face's tokenizers" % (what, first(e)))
    tok.no_truncation()
    tok.no_padding()
    return tok
if mode == "encode":
    tok = load_tokenizer()
    special = sys.argv[4] == "1"
    out.write(struct.pack("<I", tok.get_vocab_size(with_added_tokens=True)))
    for name in sys.argv[5:]:
        i = tok.token_to_id(name)
        out.write(struct.pack("<I", 0xFFFFFFFF if i is None else i))
    out.flush()
    inp = sys.stdin.buffer
    while True:
        h = inp.read(4)
        if len(h) < 4:
            break
        (n,) = struct.unpack("<I", h)
        texts = []
        for _ in range(n):
            (m,) = struct.unpack("<I", inp.read(4))
            texts.append(inp.read(m).decode("utf-8"))
        parts = []
        for e in tok.encode_batch(texts, add_special_tokens=special):
            parts.append(struct.pack("<I%dI" % len(e.ids), len(e.ids), *e.ids))
        out.write(b"".join(parts))
        out.flush()
elif mode == "tok":
    # requests on stdin, answers on stdout: (1, flag, len, text) -> (n, ids) encoded, with
    # the special tokens when flag is 1; (2, n, ids) -> (len, text) decoded, special tokens
    # skipped; (3, len, name) -> id of token name, 0xFFFFFFFF when none
    tok = load_tokenizer()
    out.write(struct.pack("<I", tok.get_vocab_size(with_added_tokens=True)))
    out.flush()
    inp = sys.stdin.buffer
    def u32():
        h = inp.read(4)
        if len(h) < 4:
            sys.exit(0)
        return struct.unpack("<I", h)[0]
    while True:
        op = u32()
        if op == 1:
            flag = u32()
            text = inp.read(u32()).decode("utf-8")
            ids = tok.encode(text, add_special_tokens=flag == 1).ids
            out.write(struct.pack("<I%dI" % len(ids), len(ids), *ids))
        elif op == 2:
            n = u32()
            ids = list(struct.unpack("<%dI" % n, inp.read(4 * n))) if n else []
            b = tok.decode(ids, skip_special_tokens=True).encode("utf-8")
            out.write(struct.pack("<I", len(b)) + b)
        elif op == 3:
            i = tok.token_to_id(inp.read(u32()).decode("utf-8"))
            out.write(struct.pack("<I", 0xFFFFFFFF if i is None else i))
        else:
            fail("%s: request %d" % (what, op))
        out.flush()
elif mode == "parquet":
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        fail("%s: needs the Python package pyarrow (%s)" % (what, first(e)))
    field = sys.argv[4]
    try:
        f = pq.ParquetFile(sys.argv[3])
    except Exception as e:
        fail("%s: not a Parquet file Arrow reads (%s)" % (what, first(e)))
    names = f.schema_arrow.names
    if field not in names:
        fail("%s: no column \"%s\" (--text-field), expected one of: %s" % (what, field, ", ".join(names)))
    typ = f.schema_arrow.field(field).type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        fail("%s: column \"%s\" holds %s, expected strings" % (what, field, typ))
    row = 0
    try:
        for batch in f.iter_batches(columns=[field], batch_size=4096):
            for v in batch.column(0).to_pylist():
                if v is None:
                    fail("%s: row %d: field \"%s\" is null, expected a string" % (what, row, field))
                if "\0" in v:
                    fail("%s: row %d: field \"%s\" holds a NUL character, expected text" % (what, row, field))
                b = v.encode("utf-8")
                out.write(struct.pack("<I", len(b)))
                out.write(b)
                row += 1
    except UnicodeDecodeError as e:
        fail("%s: row %d: field \"%s\" is not UTF-8 (%s)" % (what, row, field, first(e)))
    out.write(struct.pack("<I", 0xFFFFFFFF))
    out.flush()
)PY";

// The interpreter: $TESSERA_PYTHON, else the venv of tools/setup.sh.
std::string Python() {
  const char *env = getenv("TESSERA_PYTHON");
  return env && env[0] ? env : TS_PY_VENV "/bin/python";
}

}  // namespace

PyHelper::~PyHelper() {
  if (in_ >= 0) close(in_);
  if (out_ >= 0) close(out_);
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (!err_path_.empty()) unlink(err_path_.c_str());
}

ts_status PyHelper::Start(const char *mode, const std::vector<std::string> &args,
                          const std::string &what) {
  what_ = what;
  std::string py = Python();
  if (access(py.c_str(), X_OK) != 0)
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "%s needs Hugging Face's tokenizers and Apache Arrow's pyarrow (Python "
                        "packages, not in Debian): %s is missing; run tools/setup.sh as root (it "
                        "installs them in " TS_PY_VENV "), or set TESSERA_PYTHON to a python3 "
                        "that has them",
                        what.c_str(), py.c_str());
  signal(SIGPIPE, SIG_IGN);  // a helper that died is read as its error, not a signal here
  const char *tmp = getenv("TMPDIR");
  std::string tmpl = std::string(tmp && tmp[0] ? tmp : "/tmp") + "/tessera-py-XXXXXX";
  std::vector<char> tb(tmpl.begin(), tmpl.end());
  tb.push_back('\0');
  int errfd = mkstemp(tb.data());
  if (errfd < 0) return ts_set_error(TS_ERR_IO, "%s: a temporary file: %s", what.c_str(), strerror(errno));
  err_path_ = tb.data();
  int to[2], from[2];
  if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) {
    close(errfd);
    return ts_set_error(TS_ERR_IO, "%s: pipes: %s", what.c_str(), strerror(errno));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  posix_spawn_file_actions_adddup2(&fa, errfd, 2);
  std::vector<std::string> argv_s = {py, "-I", "-c", kScript, mode, what};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char *> argv;
  for (std::string &a : argv_s) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  int rc = posix_spawn(&pid_, py.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(to[0]);
  close(from[1]);
  close(errfd);
  in_ = to[1];
  out_ = from[0];
  if (rc != 0) {
    pid_ = -1;
    return ts_set_error(TS_ERR_IO, "%s: cannot start %s: %s", what.c_str(), py.c_str(),
                        strerror(rc));
  }
  return TS_OK;
}

ts_status PyHelper::Failed() {
  if (in_ >= 0) close(in_);
  in_ = -1;
  int status = 0;
  if (pid_ > 0) waitpid(pid_, &status, 0);
  pid_ = -1;
  std::string text, line;
  FILE *f = fopen(err_path_.c_str(), "r");
  char buf[4096];
  while (f && fgets(buf, sizeof buf, f)) {
    line = buf;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (!line.empty()) text = line;  // the last line: the script's message or Python's
  }
  if (f) fclose(f);
  if (text.empty())
    text = what_ + ": the Python helper ended (status " + std::to_string(status) + ")";
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s", text.c_str());
}

ts_status PyHelper::Write(const void *p, size_t n) {
  const char *c = (const char *)p;
  while (n > 0) {
    ssize_t k = write(in_, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return Failed();
    c += k;
    n -= (size_t)k;
  }
  return TS_OK;
}

ts_status PyHelper::Read(void *p, size_t n) {
  char *c = (char *)p;
  while (n > 0) {
    ssize_t k = read(out_, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return Failed();
    c += k;
    n -= (size_t)k;
  }
  return TS_OK;
}

ts_status PyHelper::Finish() {
  if (in_ >= 0) close(in_);
  in_ = -1;
  int status = 0;
  if (pid_ > 0 && waitpid(pid_, &status, 0) == pid_) {
    pid_ = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return TS_OK;
  }
  return Failed();
}

ts_status LoadJsonTokenizer(const char *hf_dir, bool mlm, JsonTokenizer *t) {
  std::string path = std::string(hf_dir) + "/tokenizer.json";
  TS_CHECK(ReadText(path.c_str(), &t->json));
  std::vector<std::string> args = {path, mlm ? "0" : "1"};
  static const char *const keys[5][2] = {{"pad_token", "[PAD]"}, {"unk_token", "[UNK]"},
                                         {"cls_token", "[CLS]"}, {"sep_token", "[SEP]"},
                                         {"mask_token", "[MASK]"}};
  std::string names[5];
  if (mlm) {  // the masked-LM specials, by the names tokenizer_config.json gives them
    cJSON *cfg = nullptr;
    TS_CHECK(ReadTokenizerConfig(hf_dir, &cfg));
    for (int i = 0; i < 5; i++) args.push_back(names[i] = ConfigToken(cfg, keys[i][0], keys[i][1]));
    cJSON_Delete(cfg);
  }
  TS_CHECK(t->helper.Start("encode", args, std::string("--tokenizer ") + hf_dir));
  uint32_t v = 0;
  TS_CHECK(t->helper.ReadU32(&v));
  t->vocab = v;
  for (int i = 0; mlm && i < 5; i++) {
    uint32_t id = 0;
    TS_CHECK(t->helper.ReadU32(&id));
    if (id == 0xFFFFFFFFu)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "--tokenizer %s: --mlm needs its %s \"%s\" (tokenizer_config.json's "
                          "%s, default %s), which tokenizer.json does not have",
                          hf_dir, keys[i][0], names[i].c_str(), keys[i][0], keys[i][1]);
    t->special[i] = (int32_t)id;
  }
  t->mlm = mlm;
  return TS_OK;
}

ts_status EncodeJsonDocs(JsonTokenizer *t, const std::vector<Doc> &docs,
                         std::vector<std::vector<uint32_t>> *out) {
  std::string frame;
  uint32_t n = (uint32_t)docs.size();
  frame.append((const char *)&n, 4);
  for (const Doc &d : docs) {
    uint32_t len = (uint32_t)d.text.size();
    frame.append((const char *)&len, 4);
    frame.append(d.text);
  }
  TS_CHECK(t->helper.Write(frame.data(), frame.size()));
  out->assign(docs.size(), {});
  for (size_t i = 0; i < docs.size(); i++) {
    uint32_t k = 0;
    TS_CHECK(t->helper.ReadU32(&k));
    (*out)[i].resize(k);
    if (k) TS_CHECK(t->helper.Read((*out)[i].data(), (size_t)k * 4));
  }
  return TS_OK;
}

ts_status JsonCodec::Open(const std::string &file, const std::string &what) {
  TS_CHECK(helper.Start("tok", {file}, what));
  uint32_t v = 0;
  TS_CHECK(helper.ReadU32(&v));
  vocab = v;
  return TS_OK;
}

ts_status JsonCodec::Encode(const std::string &text, bool special, std::vector<uint32_t> *ids) {
  uint32_t head[3] = {1, special ? 1u : 0u, (uint32_t)text.size()};
  TS_CHECK(helper.Write(head, sizeof head));
  TS_CHECK(helper.Write(text.data(), text.size()));
  uint32_t n = 0;
  TS_CHECK(helper.ReadU32(&n));
  ids->resize(n);
  return n ? helper.Read(ids->data(), (size_t)n * 4) : TS_OK;
}

ts_status JsonCodec::Decode(const int32_t *ids, size_t n, std::string *text) {
  uint32_t head[2] = {2, (uint32_t)n};
  TS_CHECK(helper.Write(head, sizeof head));
  if (n) TS_CHECK(helper.Write(ids, n * 4));
  uint32_t len = 0;
  TS_CHECK(helper.ReadU32(&len));
  text->assign(len, '\0');
  return len ? helper.Read(&(*text)[0], len) : TS_OK;
}

int32_t JsonCodec::TokenId(const std::string &name) {
  uint32_t head[2] = {3, (uint32_t)name.size()}, id = 0;
  if (helper.Write(head, sizeof head) != TS_OK || helper.Write(name.data(), name.size()) != TS_OK ||
      helper.ReadU32(&id) != TS_OK)
    return -1;
  return id == 0xFFFFFFFFu ? -1 : (int32_t)id;
}

ts_status StreamParquet(const std::string &path, const char *field, size_t *bytes,
                        const std::function<ts_status(std::string &&)> &take) {
  PyHelper h;
  TS_CHECK(h.Start("parquet", {path, field}, "--text " + path));
  for (;;) {
    uint32_t len = 0;
    TS_CHECK(h.ReadU32(&len));
    if (len == 0xFFFFFFFFu) break;
    std::string text(len, '\0');
    if (len) TS_CHECK(h.Read(&text[0], len));
    *bytes += len;
    if (!text.empty()) TS_CHECK(take(std::move(text)));  // empty texts skipped, as JSON Lines'
  }
  return h.Finish();
}

}  // namespace ts_prepare
