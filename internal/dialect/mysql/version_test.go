package mysql

import (
	"errors"
	"testing"
)

func TestCheckVersion(t *testing.T) {
	for v, ok := range map[string]bool{
		"10.11.19-MariaDB-0+deb12u1": true, "10.6.0-MariaDB": true, "11.4.2-MariaDB": true,
		"10.5.25-MariaDB": false, "10.3.39-MariaDB-0+deb10u1": false,
		"8.0.23": true, "8.0.36-0ubuntu0.22.04.1": true, "8.4.0": true, "9.1.0": true,
		"8.0.22": false, "5.7.44-log": false,
	} {
		err := checkVersion(v)
		if (err == nil) != ok || (err != nil && !errors.Is(err, ErrServerVersion)) {
			t.Errorf("checkVersion(%q) = %v, want ok=%v", v, err, ok)
		}
	}
}
