package main

import (
	"context"
	"errors"
	"io"
)

func runRouter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("not built yet")
}

func runLaunch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("not built yet")
}
