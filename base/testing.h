// testing.h — helpers every GoogleTest binary may share (test-only, C++17):
// a fresh temporary folder per test, removed with its contents at the end.
#ifndef TS_BASE_TESTING_H
#define TS_BASE_TESTING_H

#include <dirent.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>
#include <vector>

namespace ts_test {

// Bazel's per-test scratch folder ($TEST_TMPDIR), or /tmp outside Bazel.
inline std::string TestTmpDir() {
  const char *t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// A new folder under TestTmpDir() (mkdtemp), removed recursively when the
// object goes out of scope.
class TempDir {
 public:
  explicit TempDir(const std::string &prefix = "ts_test") {
    std::string tmpl = TestTmpDir() + "/" + prefix + ".XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    EXPECT_NE(mkdtemp(buf.data()), nullptr) << tmpl;
    dir_ = buf.data();
  }
  ~TempDir() {
    nftw(dir_.c_str(), [](const char *p, const struct stat *, int, struct FTW *) { return remove(p); },
         16, FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;

  const std::string &dir() const { return dir_; }
  std::string path(const std::string &name) const { return dir_ + "/" + name; }
  // Names in the folder other than . and .., in readdir order.
  std::vector<std::string> List() const {
    std::vector<std::string> names;
    DIR *d = opendir(dir_.c_str());
    if (!d) return names;
    while (struct dirent *e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
    return names;
  }

 private:
  std::string dir_;
};

}  // namespace ts_test

#endif  // TS_BASE_TESTING_H
