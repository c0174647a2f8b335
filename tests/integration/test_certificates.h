// Test certificates made with the openssl command line: a CA, a server
// certificate it signed for 127.0.0.1 / localhost, a client certificate it
// signed, a second unrelated CA with a client certificate of its own, and
// two token files. EC P-256 keys (fast to make); valid for two days.
#ifndef ZSHARD_TESTS_INTEGRATION_TEST_CERTIFICATES_H_
#define ZSHARD_TESTS_INTEGRATION_TEST_CERTIFICATES_H_

#include <cstdlib>
#include <fstream>
#include <string>

namespace zshard {
namespace testing {

struct TestCertificates {
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string other_ca, other_client_cert, other_client_key;
  std::string trainer_token, admin_token;  // token files
};

// Writes them under `dir`; false (with the failing command on stderr) when
// openssl is missing or fails.
inline bool MakeTestCertificates(const std::string& dir,
                                 TestCertificates* out) {
  const std::string key =
      "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes";
  const std::string q = " 2>>" + dir + "/openssl.log";
  auto run = [&](const std::string& cmd) {
    const std::string full = "cd '" + dir + "' && " + cmd + q;
    if (std::system(full.c_str()) != 0) {
      std::fprintf(stderr, "failed: %s\n", full.c_str());
      return false;
    }
    return true;
  };
  std::ofstream(dir + "/server.ext")
      << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  auto ca = [&](const std::string& name) {
    return run("openssl req -x509 " + key + " -keyout " + name + ".key -out " +
               name + ".pem -days 2 -subj /CN=" + name);
  };
  auto leaf = [&](const std::string& name, const std::string& signer,
                  const std::string& ext) {
    return run("openssl req " + key + " -keyout " + name + ".key -out " + name +
               ".csr -subj /CN=" + name) &&
           run("openssl x509 -req -in " + name + ".csr -CA " + signer +
               ".pem -CAkey " + signer + ".key -CAcreateserial -out " + name +
               ".pem -days 2" + ext);
  };
  if (!ca("ca") || !ca("other-ca") ||
      !leaf("server", "ca", " -extfile server.ext") ||
      !leaf("client", "ca", "") || !leaf("other-client", "other-ca", "")) {
    return false;
  }
  std::ofstream(dir + "/trainer.token") << "trainer-token-0123456789abcdef\n";
  std::ofstream(dir + "/admin.token") << "admin-token-fedcba9876543210\n";
  out->ca = dir + "/ca.pem";
  out->server_cert = dir + "/server.pem";
  out->server_key = dir + "/server.key";
  out->client_cert = dir + "/client.pem";
  out->client_key = dir + "/client.key";
  out->other_ca = dir + "/other-ca.pem";
  out->other_client_cert = dir + "/other-client.pem";
  out->other_client_key = dir + "/other-client.key";
  out->trainer_token = dir + "/trainer.token";
  out->admin_token = dir + "/admin.token";
  return true;
}

}  // namespace testing
}  // namespace zshard

#endif  // ZSHARD_TESTS_INTEGRATION_TEST_CERTIFICATES_H_
