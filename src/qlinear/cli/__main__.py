from qlinear.cli import command

command()
