import BrokerCrypto
import Foundation
import JOSE
import TestSupport
import Testing

/// The `fuzz-jose` seed corpus (Fuzz/Corpus/jose) replayed through the verifier and the JWK
/// readers: the first byte picks the reader, as in the fuzz target. Seeds signed by a key
/// nobody trusts must all be refused; the key seeds must all be read.
@Suite("JOSE fuzz corpus regressions")
struct JOSEFuzzCorpusTests {
    @Test("token seeds are refused with a JOSE error; JWK and JWK Set seeds are read")
    func replay() throws {
        let folder = Repository.root.appendingPathComponent("Fuzz/Corpus/jose")
        let names = try FileManager.default.contentsOfDirectory(atPath: folder.path).sorted()
        #expect(names.count >= 5)
        let keys = JWKSet(keys: [JWK(key: try AsymmetricKey.generateRSA(), keyID: "fuzz-rsa")])
        for name in names {
            let bytes = Array(try Data(contentsOf: folder.appendingPathComponent(name)))
            guard let mode = bytes.first else { continue }
            let input = Array(bytes.dropFirst())
            switch mode % 3 {
            case 0:
                #expect(throws: JOSEError.self, "\(name)") {
                    try JWSVerifier().verify(String(decoding: input, as: UTF8.self), keys: keys)
                }
            case 1: #expect((try? JWK(json: input)) != nil, "\(name)")
            default: #expect((try? JWKSet(json: input)) != nil, "\(name)")
            }
        }
    }
}
