package webhook

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// Secret sizes, in bytes of key material.
const (
	// MinStandardSecretBytes and MaxStandardSecretBytes bound a Standard Webhooks key: the
	// spec ("Signature scheme") has secrets of 24 to 64 random bytes (192–512 bits), written
	// "whsec_" followed by their standard base64.
	MinStandardSecretBytes = 24
	MaxStandardSecretBytes = 64
	// MinSeedSecretBytes is the shortest secret the seed scheme (SchemeHMACSHA256) signs with:
	// 16 bytes (128 bits, above the 112-bit HMAC key strength NIST SP 800-107 Rev. 1 §5.3.4
	// and SP 800-131A ask for). The secret's bytes are the key as written, so a text secret
	// needs at least 16 characters of ASCII; 32 random bytes (the HMAC-SHA256 block's output
	// size, RFC 2104 §3) are recommended. There is no maximum (RFC 2104 hashes longer keys).
	MinSeedSecretBytes = 16
)

// DecodeSecret turns a Standard Webhooks secret into key bytes: the secret must be "whsec_"
// followed by the standard base64 (padding required) of MinStandardSecretBytes to
// MaxStandardSecretBytes bytes (24–64), as the Standard Webhooks spec and its reference
// libraries write secrets. Anything else — no prefix, invalid base64, a key of another length —
// yields an error wrapping ErrInvalidSecret that never contains the secret. Safe for
// concurrent use.
func DecodeSecret(secret string) ([]byte, error) {
	if secret == "" {
		return nil, fmt.Errorf("%w: empty", ErrInvalidSecret)
	}
	enc, ok := strings.CutPrefix(secret, standardPrefix)
	if !ok {
		return nil, fmt.Errorf("%w: a Standard Webhooks secret starts with %q", ErrInvalidSecret, standardPrefix)
	}
	key, err := base64.StdEncoding.Strict().DecodeString(enc)
	if err != nil {
		return nil, fmt.Errorf("%w: the part after %q is not standard base64", ErrInvalidSecret, standardPrefix)
	}
	if len(key) < MinStandardSecretBytes || len(key) > MaxStandardSecretBytes {
		return nil, fmt.Errorf("%w: the key is %d bytes; Standard Webhooks keys are %d to %d bytes",
			ErrInvalidSecret, len(key), MinStandardSecretBytes, MaxStandardSecretBytes)
	}
	return key, nil
}

// seedKey checks a seed-scheme secret and returns its bytes: at least MinSeedSecretBytes.
func seedKey(secret string) ([]byte, error) {
	if len(secret) < MinSeedSecretBytes {
		return nil, fmt.Errorf("%w: the seed scheme's secret is %d bytes; at least %d are required", ErrInvalidSecret, len(secret), MinSeedSecretBytes)
	}
	return []byte(secret), nil
}

// signingKeys checks the secrets one message is signed with and returns their keys, in order.
// field names the configuration field in the *ConfigError it returns ("Secret", "Secrets",
// "Target.Secrets"). No secrets at all yields nil keys: unsigned with the seed scheme, which
// the caller refuses for Standard Webhooks.
func signingKeys(scheme SignatureScheme, field, secret string, secrets []string) ([][]byte, error) {
	if secret != "" && len(secrets) > 0 {
		return nil, &ConfigError{Field: field, Reason: "set either Secret or Secrets, not both"}
	}
	if secret != "" {
		secrets = []string{secret}
	} else {
		field += "s"
	}
	if scheme == SchemeHMACSHA256 && len(secrets) > 1 {
		return nil, &ConfigError{Field: field, Reason: "the seed scheme sends one signature: rotate by listing the old and the new key in the receiver's VerifyOptions.Keys, then switching the sender's Secret", Err: ErrInvalidSecret}
	}
	keys := make([][]byte, 0, len(secrets))
	for i, s := range secrets {
		var (
			k   []byte
			err error
		)
		if scheme == SchemeStandardWebhooks {
			k, err = DecodeSecret(s)
		} else {
			k, err = seedKey(s)
		}
		if err != nil {
			f := field
			if len(secrets) > 1 || secret == "" {
				f = fmt.Sprintf("%s[%d]", field, i)
			}
			return nil, &ConfigError{Field: f, Reason: "invalid " + scheme.String() + " secret", Err: err}
		}
		keys = append(keys, k)
	}
	return keys, nil
}
