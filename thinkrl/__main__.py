from thinkrl.cli import run

run()
